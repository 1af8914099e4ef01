"""Source files of every format the importers read, written as their own tools write them (for the importer tests)."""

from __future__ import annotations

import gzip
import json
import struct

import numpy as np
import zstandard

from atlas_remote.importers import webdataset


def make_webdataset(folder, shards=3, per_shard=40) -> list[str]:
    import webdataset as wds

    rng = np.random.default_rng(0)
    urls = []
    for s in range(shards):
        path = str(folder / f"train-{s:06d}.tar")
        with wds.TarWriter(path) as sink:
            for i in range(per_shard):
                sink.write(
                    {
                        "__key__": f"sample{s:02d}{i:04d}",
                        "jpg": rng.bytes(int(rng.integers(10, 200))),
                        "cls": str(i % 7).encode(),
                        "meta.json": json.dumps({"i": i}).encode(),
                    }
                )
        urls.append(path)
    return urls


def make_megatron(
    prefix, documents=30, dtype=np.uint16, code=8, *, seed=1, counted="entries", first_token=None, eod=None
) -> list[dict]:
    """The .idx as megatron-core's _IndexWriter writes it; returns the expected examples (one per sequence).
    counted="documents": the header's document count as some descriptions of the format have it (the documents,
    the index array one longer). first_token: token ids counting up from it (unique within the corpus), else
    random; eod: each document's last sequence ends with it (preprocess_data.py --append-eod)."""
    rng = np.random.default_rng(seed)
    lengths, expected, document_indices, data = [], [], [0], bytearray()
    for d in range(documents):
        sequences = int(rng.integers(1, 4))
        for k in range(sequences):
            tokens = rng.integers(0, 30000, int(rng.integers(1, 300))).astype(dtype)
            if first_token is not None:
                tokens = np.arange(first_token, first_token + len(tokens)).astype(dtype)
                first_token += len(tokens)
            if eod is not None and k == sequences - 1:
                tokens[-1] = eod
            lengths.append(len(tokens))
            expected.append({"tokens": tokens, "document": d})
            data += tokens.tobytes()
        document_indices.append(len(lengths))
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]) * np.dtype(dtype).itemsize
    count = len(document_indices) - (counted == "documents")
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)) + struct.pack("<Q", count))
        f.write(np.array(lengths, np.int32).tobytes() + np.array(pointers, np.int64).tobytes())
        f.write(np.array(document_indices, np.int64).tobytes())
    with open(f"{prefix}.bin", "wb") as f:
        f.write(bytes(data))
    return expected


def make_dolma(root) -> list[dict]:
    """Two documents files (.jsonl.gz, .jsonl.zst) and two attribute sets mirroring them."""
    expected = []
    files = {"2019-09/0933_uk.jsonl.gz": gzip.compress, "2019-10/0106_vi.jsonl.zst": zstandard.compress}
    for rel, compress in sorted(files.items()):
        docs, tox, lang = [], [], []
        for i in range(25):
            doc = {"id": f"{rel}-{i}", "text": f"document {i} " * (i + 1), "source": "test", "attributes": {"own": i}}
            docs.append(doc)
            tox.append({"id": doc["id"], "source": "test", "attributes": {"toxicity": i / 25}})
            lang.append({"id": doc["id"], "source": "test", "attributes": {"lang": {"en": 0.9}}})
            expected.append({**doc, "attributes": {"own": i, "toxicity": i / 25, "lang": {"en": 0.9}}})
        for sub, rows in (("documents", docs), ("attributes/toxicity-0", tox), ("attributes/lang", lang)):
            path = root / sub / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(compress("\n".join(json.dumps(r) for r in rows).encode() + b"\n"))
    return expected


L5KIT_LABELS = 17

SCENE_DTYPE = [
    ("frame_index_interval", np.int64, (2,)),
    ("host", "<U16"),
    ("start_time", np.int64),
    ("end_time", np.int64),
]


FRAME_DTYPE = [
    ("timestamp", np.int64),
    ("agent_index_interval", np.int64, (2,)),
    ("traffic_light_faces_index_interval", np.int64, (2,)),
    ("ego_translation", np.float64, (3,)),
    ("ego_rotation", np.float64, (3, 3)),
]


AGENT_DTYPE = [
    ("centroid", np.float64, (2,)),
    ("extent", np.float32, (3,)),
    ("yaw", np.float32),
    ("velocity", np.float32, (2,)),
    ("track_id", np.uint64),
    ("label_probabilities", np.float32, (L5KIT_LABELS,)),
]


TL_FACE_DTYPE = [("face_id", "<U16"), ("traffic_light_id", "<U16"), ("traffic_light_face_status", np.float32, (3,))]


def make_zarr(path, frames_per_scene=(9, 14, 5), chunks=(2, 5, 7, 4)) -> list[dict]:
    import zarr

    rng = np.random.default_rng(2)
    n_scenes = len(frames_per_scene)
    n_frames = sum(frames_per_scene)
    agents_per_frame = rng.integers(0, 6, n_frames)
    faces_per_frame = rng.integers(0, 3, n_frames)
    scenes = np.zeros(n_scenes, SCENE_DTYPE)
    starts = np.concatenate([[0], np.cumsum(frames_per_scene)])
    scenes["frame_index_interval"] = np.stack([starts[:-1], starts[1:]], 1)
    scenes["host"] = [f"host-{i}" for i in range(n_scenes)]
    frames = np.zeros(n_frames, FRAME_DTYPE)
    a, t = np.concatenate([[0], np.cumsum(agents_per_frame)]), np.concatenate([[0], np.cumsum(faces_per_frame)])
    frames["agent_index_interval"] = np.stack([a[:-1], a[1:]], 1)
    frames["traffic_light_faces_index_interval"] = np.stack([t[:-1], t[1:]], 1)
    frames["timestamp"] = np.arange(n_frames) * 100
    frames["ego_translation"] = rng.normal(size=(n_frames, 3))
    frames["ego_rotation"] = rng.normal(size=(n_frames, 3, 3))
    agents = np.zeros(int(a[-1]), AGENT_DTYPE)
    agents["centroid"] = rng.normal(size=(len(agents), 2))
    agents["track_id"] = np.arange(len(agents))
    agents["label_probabilities"] = rng.random((len(agents), L5KIT_LABELS))
    faces = np.zeros(int(t[-1]), TL_FACE_DTYPE)
    faces["face_id"] = [f"face{i}" for i in range(len(faces))]
    faces["traffic_light_face_status"] = rng.random((len(faces), 3))
    root = zarr.open_group(str(path), mode="w")
    for name, array, chunk in zip(
        ("scenes", "frames", "agents", "traffic_light_faces"), (scenes, frames, agents, faces), chunks
    ):
        root.create_dataset(name, data=array, chunks=(chunk,), dtype=array.dtype)
    scene_of = np.repeat(np.arange(n_scenes), frames_per_scene)
    return [
        {
            "scene_index": int(scene_of[i]),
            "frame_index": i,
            "frame": {name: frames[i][name] for name in frames.dtype.names},
            "agents": agents[a[i] : a[i + 1]],
            "traffic_light_faces": faces[t[i] : t[i + 1]],
        }
        for i in range(n_frames)
    ]


def make_jsonl(folder) -> list[dict]:
    rows = [{"id": i, "text": "x" * i, "tags": ["a", "b"][: i % 3]} for i in range(70)]
    (folder / "a.jsonl.gz").write_bytes(gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in rows[:40])))
    (folder / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[40:]) + "\n")
    return rows


def sources(tmp_path) -> dict[str, tuple[str, list]]:
    """format -> (source, expected examples)"""
    (tmp_path / "wds").mkdir()
    urls = make_webdataset(tmp_path / "wds")
    (tmp_path / "mega").mkdir()
    expected_mega = make_megatron(tmp_path / "mega" / "a") + make_megatron(tmp_path / "mega" / "b", documents=12)
    (tmp_path / "dolma").mkdir()
    (tmp_path / "j").mkdir()
    return {
        "webdataset": (str(tmp_path / "wds" / "train-{000000..000002}.tar"), list(webdataset.samples(urls))),
        "megatron": ([str(tmp_path / "mega" / "a"), str(tmp_path / "mega" / "b.idx")], expected_mega),
        "dolma": (str(tmp_path / "dolma"), make_dolma(tmp_path / "dolma")),
        "zarr": (str(tmp_path / "scenes.zarr"), make_zarr(tmp_path / "scenes.zarr")),
        "jsonl": (str(tmp_path / "j" / "*.jsonl*"), make_jsonl(tmp_path / "j")),
    }
