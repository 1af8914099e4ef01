"""What the CLI prints from data, and every error message, has what a terminal would act on escaped: an example's
text, a global's name in a block, a file or member name, a server's error text (`errors.printable`)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import pickle
import socket
import tarfile
import threading

import numpy as np
import pytest
from helpers import write_dataset
from hypothesis import given
from hypothesis import strategies as st

import atlas_remote as ar
from atlas_remote import CompressionStrategy as CS
from atlas_remote.cli import main
from atlas_remote.errors import printable

# C0 and C1 controls, DEL, and the bidi overrides and isolates
ACTING = {*range(0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
HOSTILE = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\u202etxt.exe\x9b1m\x7f"


def acting(text: str) -> set[str]:
    """What a terminal would act on, but the line breaks between lines."""
    return {c for c in text.replace("\n", "") if ord(c) in ACTING}


@given(st.text())
def test_printable_leaves_nothing_a_terminal_acts_on(text):
    out = printable(text)
    assert not {c for c in out if ord(c) in ACTING}
    assert printable(out) == out, "escaping twice changes nothing"


@given(st.text(alphabet=st.characters(blacklist_characters="".join(map(chr, ACTING)))))
def test_printable_leaves_ordinary_text_as_it_is(text):
    assert printable(text) == text


def test_printable_writes_python_escapes():
    assert printable("a\x1bb\u202ec\x85d\x7fe\n\té") == "a\\x1bb\\u202ec\\x85d\\x7fe\\n\\té"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--quiet"])
    out, err = capsys.readouterr()
    return done.value.code, out, err


def test_head_cat_and_get_escape_what_examples_hold(capsys, tmp_path):
    """Before: text inside a numpy string array (and any repr an allowed class gives) was printed raw."""
    examples = [
        {"text": HOSTILE, HOSTILE: 1},
        np.array([HOSTILE, "plain"]),
        HOSTILE.encode(),
        (HOSTILE, [HOSTILE]),
    ]
    url = write_dataset(str(tmp_path / "ds"), examples, 10, 2)
    for argv in (("head", url), ("cat", url), ("get", url, "1", "0"), ("cat", url, "--json")):
        code, out, err = run(capsys, *argv)
        assert code == 0 and not acting(out) and not acting(err), (argv, out)
        assert "red" in out and ("\\x1b" in out or "\\u001b" in out)
    code, out, _ = run(capsys, "cat", url, "--json")
    assert json.loads(out.splitlines()[0])["example"]["text"] == HOSTILE, "JSON lines stay exact"


def block_naming(global_name: str) -> bytes:
    """A pickled block that names a global: refused by the restricted unpickler, which names it."""
    module, name = global_name.rsplit(".", 1)
    return b"\x80\x02]q\x00c" + module.encode() + b"\n" + name.encode() + b"\n)Rq\x01a."


def with_block(tmp_path, raw: bytes) -> str:
    """A dataset whose second block is `raw` (stored as it is, no checksums to disagree)."""
    url = write_dataset(
        str(tmp_path / "ds"), list(range(4)), 10, 2, compression_strategy=CS.NO_COMPRESSION, checksums=False
    )
    shard = tmp_path / "ds" / "0"
    offsets = np.load(shard / "index.npy").tolist()
    data = shard / "data.bin"
    first = data.read_bytes()[: offsets[1]]
    data.write_bytes(first + raw)
    from atlas_remote.format.spec import encode_index

    (shard / "index.npy").write_bytes(encode_index([0, offsets[1], offsets[1] + len(raw)]))
    (tmp_path / "ds" / "atlas_manifest.npz").unlink(missing_ok=True)
    assert pickle.loads(first) == [0, 1]
    return url


def test_a_global_name_with_terminal_escapes_is_escaped_everywhere(capsys, tmp_path):
    """Before: `head` and `verify` printed the refused global's name raw (the error line and the report)."""
    url = with_block(tmp_path, block_naming(f"os{HOSTILE}.system"))
    with pytest.raises(ar.UnsafePickleError) as refused:
        ar.open(url)[2]
    assert not acting(str(refused.value)) and "owned" in str(refused.value)
    code, out, err = run(capsys, "head", url)
    assert code == 1 and not acting(err) and "owned" in err and err.count("\n") == 1
    code, out, err = run(capsys, "verify", url)
    assert code == 1 and not acting(out + err) and "owned" in out


def test_file_and_member_names_in_errors_are_escaped(capsys, tmp_path):
    """A tar member's name and a source file's name, quoted in convert's error line."""
    tar = tmp_path / "shard.tar"
    with tarfile.open(tar, "w") as archive:
        for _ in range(2):  # one suffix twice in a sample: an error that names the member
            info = tarfile.TarInfo(f"sample{HOSTILE}.txt")
            info.size = 1
            archive.addfile(info, io.BytesIO(b"x"))
    code, _, err = run(capsys, "convert", str(tar), str(tmp_path / "out"), "--from", "webdataset")
    assert code == 1 and not acting(err) and "owned" in err and err.count("\n") == 1
    broken = tmp_path / f"rows{HOSTILE}.jsonl"
    broken.write_text('{"a": 1}\n{"a": \n')
    code, _, err = run(capsys, "convert", str(broken), str(tmp_path / "out2"), "--from", "jsonl")
    assert code == 1 and not acting(err) and "line 2" in err and "owned" in err


@contextlib.contextmanager
def answering_403(body: bytes):
    """A server on 127.0.0.1 answering every request 403 with this body (an S3-style error, text of its own)."""

    async def handle(reader, writer):
        with contextlib.suppress(Exception):
            await reader.readuntil(b"\r\n\r\n")
            head = b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\nConnection: close\r\n"
            writer.write(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
        writer.close()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", port))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        server.close()
        loop.close()


def test_a_servers_error_text_is_escaped(capsys):
    """Before: the S3 client quoted the server's error body raw in the error line."""
    body = f"<Error><Code>AccessDenied</Code><Message>denied {HOSTILE}</Message></Error>".encode()
    with answering_403(body) as endpoint:
        options = json.dumps({"endpoint_url": endpoint, "key": "k", "secret": "s"})
        code, out, err = run(capsys, "info", "s3://bucket/ds", "--storage-options", options)
    assert code == 1 and not acting(err) and err.count("\n") == 1, err
    assert "atlas-remote: error: s3://bucket/ds/meta.json" in err
