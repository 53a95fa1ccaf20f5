#!/usr/bin/env python3
"""Writes the generated part of the fuzz seed corpus (fuzz/corpus/), deterministically.

Seeds named ok-* must be accepted by their reader and bad-* refused (fuzz/replay_main.cpp checks it). The
seeds the engine wrote (a checkpoint, metrics streams) are not made here; fuzz/corpus/README.md lists them.
The inputs fuzzers found (regress-*) are kept as they were found. Run from anywhere:
    python3 fuzz/make_seeds.py
"""
import gzip
import json
import os
import shutil
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
FASHION = "/usr/share/datasets/fashion-mnist"


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# --- run configs: the example projects, some broken configs of tests/data/broken, and a few more.
def config_seeds():
    ex = os.path.join(ROOT, "resources", "examples")
    for name in sorted(os.listdir(ex)):
        if name.endswith(".json") and name != "gpt3-175b-16k.json":  # 140 KB, over the fuzzers' 16 KB limit
            shutil.copyfile(os.path.join(ex, name), os.path.join(CORPUS, "fuzz_config", "ok-" + name))
    broken = os.path.join(ROOT, "tests", "data", "broken")
    for name in ["syntax_error", "duplicate_key", "bad_enum", "empty", "integer_too_large", "non_integral",
                 "layer_placed_twice", "heads_not_dividing_width", "too_many_ranks", "betas_one_entry",
                 "stage_out_of_range", "key_in_wrong_section"]:
        shutil.copyfile(os.path.join(broken, name + ".json"), os.path.join(CORPUS, "fuzz_config", f"bad-{name}.json"))
    put("fuzz_config", "ok-minimal.json", '{"model": {"type": "mlp"}, "data": {"kind": "fashion_mnist"}}\n')
    put("fuzz_config", "bad-number-beyond-double.json", '{"optimizer": {"lr": 1e400}}\n')
    put("fuzz_config", "bad-deep.json", "[" * 100 + "]" * 100)
    put("fuzz_config", "bad-not-object.json", "[1, 2, 3]\n")
    put("fuzz_config", "bad-nul-byte.json", b'{"name": "a\x00b"}')


# --- safetensors: built here after the format (8-byte little-endian header length, JSON header padded with
# spaces, then the data), like the engine's writeSafetensors() lays them out.
def safetensors(tensors, metadata=None, header_override=None, pad=True, extra=b""):
    header = {}
    data = b""
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata is not None:
        header["__metadata__"] = metadata
    text = header_override if header_override is not None else json.dumps(header, separators=(",", ":"))
    raw = text.encode()
    if pad:
        raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data + extra


def safetensors_seeds():
    f32 = struct.pack("<6f", 0.5, -1.25, 3.0, 0.0, 1e-3, -7.5)
    i32 = struct.pack("<3i", 1, -2, 2147483647)
    bf16 = struct.pack("<4H", 0x3F80, 0xBF80, 0x7F80, 0x7FC0)  # 1, -1, inf, nan
    f16 = struct.pack("<2H", 0x3C00, 0xFC00)  # 1, -inf
    put("fuzz_safetensors", "ok-all-dtypes.safetensors",
        safetensors([("blocks.0.w", "F32", [2, 3], f32), ("step", "I32", [3], i32), ("half", "BF16", [2, 2], bf16),
                     ("f16", "F16", [2], f16)], {"format": "pt", "step": "12"}))
    put("fuzz_safetensors", "ok-empty-tensor.safetensors", safetensors([("empty", "F32", [0, 4], b"")]))
    put("fuzz_safetensors", "ok-scalar.safetensors", safetensors([("s", "F32", [], struct.pack("<f", 2.0))]))
    put("fuzz_safetensors", "ok-no-tensors.safetensors", safetensors([], {"only": "metadata"}))
    put("fuzz_safetensors", "bad-short.safetensors", b"\x10\x00\x00")
    put("fuzz_safetensors", "bad-header-beyond-file.safetensors", struct.pack("<Q", 1 << 40) + b"{}")
    put("fuzz_safetensors", "bad-header-not-json.safetensors", safetensors([], header_override='{"a": '))
    put("fuzz_safetensors", "bad-header-array.safetensors", safetensors([], header_override="[1]"))
    put("fuzz_safetensors", "bad-dtype.safetensors", safetensors([("x", "F64", [1], b"\0" * 8)]))
    put("fuzz_safetensors", "bad-shape-size.safetensors",
        safetensors([], header_override='{"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', extra=b"\0" * 8))
    put("fuzz_safetensors", "bad-outside.safetensors",
        safetensors([], header_override='{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', extra=b"\0" * 8))
    put("fuzz_safetensors", "bad-overlap.safetensors",
        safetensors([], header_override='{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                        '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', extra=b"\0" * 12))
    put("fuzz_safetensors", "bad-metadata-number.safetensors", safetensors([], {"step": 3}))
    put("fuzz_safetensors", "bad-negative-shape.safetensors",
        safetensors([], header_override='{"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}}'))
    put("fuzz_safetensors", "bad-deep-header.safetensors",
        safetensors([], header_override='{"x":' + "[" * 64 + "]" * 64 + "}"))
    put("fuzz_safetensors", "bad-huge-shape.safetensors",
        safetensors([], header_override='{"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}'))


# --- llm.c token shards: a 256-int32 header (magic 20240520, version 1, count) and count uint16 tokens.
def shard(tokens, magic=20240520, version=1, count=None, cut=0):
    header = struct.pack("<3i", magic, version, len(tokens) if count is None else count) + b"\0" * (1024 - 12)
    data = header + struct.pack(f"<{len(tokens)}H", *tokens)
    return data[: len(data) - cut] if cut else data


def token_seeds():
    with open(os.path.join(ROOT, "resources", "examples", "gpt-fortunes.json"), "rb") as f:
        text = f.read()[:200]  # bytes as tokens, as the text kind reads them
    put("fuzz_tokens", "ok-bytes.bin", shard(list(text)))
    put("fuzz_tokens", "ok-gpt2-range.bin", shard([50256, 0, 15496, 11, 995, 50256, 1, 2, 3, 4]))
    put("fuzz_tokens", "ok-exactly-seq-len-plus-one.bin", shard([5, 6, 7, 8, 9]))
    put("fuzz_tokens", "bad-too-few.bin", shard([1, 2, 3, 4]))
    put("fuzz_tokens", "bad-token-beyond-vocab.bin", shard([1, 2, 3, 50257, 4, 5]))
    put("fuzz_tokens", "bad-magic.bin", shard([1, 2, 3, 4, 5], magic=20240521))
    put("fuzz_tokens", "bad-version.bin", shard([1, 2, 3, 4, 5], version=2))
    put("fuzz_tokens", "bad-count-too-large.bin", shard([1, 2, 3, 4, 5], count=6))
    put("fuzz_tokens", "bad-count-negative.bin", shard([1, 2, 3, 4, 5], count=-1))
    put("fuzz_tokens", "bad-odd-length.bin", shard([1, 2, 3, 4, 5], cut=1))
    put("fuzz_tokens", "bad-short-header.bin", shard([])[:100])
    put("fuzz_tokens", "bad-empty.bin", b"")


# --- IDX: the first byte picks the file the rest replaces (0 train images, 1 train labels, 2 test images,
# 3 test labels; fuzz/fuzz_idx.cpp), the rest is that file, gzip-compressed or not. Real images and labels:
# the first of Debian's dataset-fashion-mnist.
def idx_seeds():
    with gzip.open(os.path.join(FASHION, "train-images-idx3-ubyte.gz")) as f:
        train_images = f.read(16 + 3 * 784)
    with gzip.open(os.path.join(FASHION, "train-labels-idx1-ubyte.gz")) as f:
        train_labels = f.read(8 + 3)
    with gzip.open(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz")) as f:
        test_images = f.read(16 + 2 * 784)
    with gzip.open(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")) as f:
        test_labels = f.read(8 + 2)

    def count(data, n):  # the header's first dimension set to n
        return data[:4] + struct.pack(">I", n) + data[8:]

    train_images, train_labels = count(train_images, 3), count(train_labels, 3)
    test_images, test_labels = count(test_images, 2), count(test_labels, 2)
    gz = lambda b: gzip.compress(b, mtime=0)
    put("fuzz_idx", "ok-train-images.idx", b"\x00" + train_images)
    put("fuzz_idx", "ok-train-labels.idx", b"\x01" + train_labels)
    put("fuzz_idx", "ok-test-images.gz", b"\x02" + gz(test_images))
    put("fuzz_idx", "ok-test-labels.gz", b"\x03" + gz(test_labels))
    put("fuzz_idx", "bad-images-magic.idx", b"\x00" + b"\x00\x00\x08\x01" + train_images[4:])
    put("fuzz_idx", "bad-images-truncated.idx", b"\x00" + train_images[:-1])
    put("fuzz_idx", "bad-images-trailing.idx", b"\x00" + train_images + b"\x00")
    put("fuzz_idx", "bad-images-27x28.idx", b"\x00" + train_images[:8] + struct.pack(">2I", 27, 28) + train_images[16:])
    put("fuzz_idx", "bad-images-header.idx", b"\x02" + test_images[:10])
    put("fuzz_idx", "bad-images-count-huge.idx", b"\x00" + count(train_images, 0xFFFFFFFF))
    put("fuzz_idx", "bad-images-none.idx", b"\x02" + count(test_images, 0)[:16])
    put("fuzz_idx", "bad-label-ten.idx", b"\x01" + train_labels[:-1] + b"\x0a")
    put("fuzz_idx", "bad-labels-count.idx", b"\x03" + count(test_labels, 3) + b"\x01")
    put("fuzz_idx", "bad-gzip-truncated.gz", b"\x01" + gz(train_labels)[:-6])
    put("fuzz_idx", "bad-gzip-garbage.gz", b"\x00\x1f\x8b" + b"not deflate data at all")
    put("fuzz_idx", "bad-empty.idx", b"\x03")


# --- metrics streams: a few hand-written lines around the real streams (see fuzz/corpus/README.md).
def metrics_seeds():
    put("fuzz_metrics", "ok-empty.jsonl", "")
    put("fuzz_metrics", "ok-no-final-newline.jsonl",
        '{"v":1,"type":"log","level":"info","message":"hi"}\n{"v":1,"type":"run_end","status":"ok","step":3}')
    put("fuzz_metrics", "ok-unknown-type-and-newer-version.jsonl",
        '{"v":1,"type":"future_thing","x":1}\n{"v":2,"type":"step","step":1,"loss":2.5}\r\n\n')
    put("fuzz_metrics", "bad-not-json.jsonl", 'not json\n{"v":1,"type":"step","step":1,"loss":2.5}\n')
    put("fuzz_metrics", "bad-wrong-types.jsonl",
        '{"v":1,"type":"step","step":"one"}\n{"v":"1","type":"step"}\n[1,2]\n{"type":"step","step":1}\n'
        '{"v":1,"type":"spans","step":1,"ranks":[{"rank":0,"spans":[{"a":"FF","s":0,"e":"x"}]}]}\n')
    put("fuzz_metrics", "bad-truncated-last-line.jsonl", '{"v":1,"type":"step","step":1,"lo')
    put("fuzz_metrics", "bad-invalid-utf8.jsonl", b'{"v":1,"type":"log","message":"\xff\xfe"}\n\xc3\x28\n')


if __name__ == "__main__":
    for t in ["fuzz_config", "fuzz_safetensors", "fuzz_tokens", "fuzz_idx", "fuzz_metrics"]:
        os.makedirs(os.path.join(CORPUS, t), exist_ok=True)
    config_seeds()
    safetensors_seeds()
    token_seeds()
    idx_seeds()
    metrics_seeds()
