"""A Megatron corpus looked at where it lies: `atlas-remote info`, `head`, `get` and `cat` on a prefix, an .idx or
a glob of them (documents as token ids), and `view`'s answers (documents and tokens per file, every document's
length from the .idx, a page of documents in one read) over S3."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
from source_files import make_megatron

import atlas_remote as ar
from atlas_remote.cli import main
from atlas_remote.viewer import view


def run(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def documents(prefix) -> list[list[int]]:
    """The importer's sequences joined into documents (as token id lists)."""
    joined: dict[int, list[int]] = {}
    for s in make_megatron(prefix, 40, eod=0):
        joined.setdefault(s["document"], []).extend(s["tokens"].tolist())
    return [joined[d] for d in sorted(joined)]


def test_info_head_get_and_cat_on_a_prefix(tmp_path, capsys):
    docs = documents(tmp_path / "web_text_document")
    prefix = str(tmp_path / "web_text_document")
    code, out, _ = run(capsys, "info", prefix)
    assert code == 0
    assert "Megatron IndexedDataset, read in place (1 file(s))" in out and "documents   40 (" in out
    assert f"tokens      {sum(map(len, docs)):,} (uint16)" in out
    assert "token 0 in every document sampled (written with --append-eod: give TokenStream no eod)" in out
    code, out, _ = run(capsys, "info", f"{prefix}.idx", "--json")
    facts = json.loads(out)
    assert facts["documents"] == 40 and facts["ends_with"] == 0 and facts["format"] == "megatron"
    code, out, _ = run(capsys, "head", "-n", "2", str(tmp_path / "*.idx"), "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["example"]["tokens"] for line in lines] == docs[:2], "documents as token ids"
    code, out, _ = run(capsys, "get", prefix, "-1", "3")
    assert out.startswith("[-1] {'tokens': array(dtype=uint16, shape=(") and "[3] {'tokens'" in out
    code, out, _ = run(capsys, "cat", prefix, "--start", "38", "--json")
    assert [json.loads(line)["example"]["tokens"] for line in out.splitlines()] == docs[38:]


def test_a_url_that_is_neither_is_one_line(tmp_path, capsys):
    code, _, err = run(capsys, "info", str(tmp_path / "nothing"))
    assert code == 1 and "no meta.json here" in err and len(err.strip().splitlines()) == 1
    make_megatron(tmp_path / "short", 20)
    open(tmp_path / "short.bin", "r+b").truncate(100)
    code, _, err = run(capsys, "head", str(tmp_path / "short"))
    assert code == 1 and "shorter than its .idx pointers" in err and len(err.strip().splitlines()) == 1


def test_the_viewer_answers_from_the_idx_and_reads_a_page_in_one_request(tmp_path, s3):
    options, bucket, fs = s3
    docs = documents(tmp_path / "a_text_document")
    make_megatron(tmp_path / "b_text_document", 25, np.int32, 4, seed=2)
    for name in ("a_text_document", "b_text_document"):
        for suffix in (".idx", ".bin"):
            fs.pipe(f"{bucket}/mg/{name}{suffix}", (tmp_path / f"{name}{suffix}").read_bytes())
    server = view(ar.megatron(f"s3://{bucket}/mg/*.idx", options))
    try:

        def ask(path: str) -> dict:
            with urllib.request.urlopen(server.url + path, timeout=60) as response:
                return json.loads(response.read())

        summary = ask("api/summary")
        assert summary["examples"] == 65 and summary["shards_present"] == 2
        assert dict(summary["facts"])["documents"].startswith("65 (")
        shards = ask("api/shards")
        assert shards["examples"] == [40, 25] and shards["names"] == ["a_text_document", "b_text_document"]
        sample = ask("api/sample")
        assert sum(sample["lengths"]["counts"]) == 65 and sample["cost"]["requests"] == 0, "lengths from the .idx"
        page = ask("api/examples?start=35&count=10")
        assert page["columns"] == ["tokens"] and [row["index"] for row in page["rows"]] == list(range(35, 45))
        assert page["rows"][0]["cells"][0]["values"][:5] == [str(t) for t in docs[35][:5]]
        assert page["cost"]["by_kind"] == {"bin": 2}, "one ranged read per file the page spans"
    finally:
        server.shutdown()
        server.server_close()
