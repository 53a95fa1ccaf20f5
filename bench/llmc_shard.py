"""Token shards in llm.c's format (the engine's "tokens" data kind): a 256-int32 header (magic 20240520,
version 1, token count) followed by the tokens as uint16. Shared by the GPU benchmarks, which train on
synthetic tokens (their throughput and memory do not depend on the data)."""
import array


def write_shard(path, count, vocab):
    """count tokens (i * 2654435761) % vocab (Knuth's multiplicative hash: spread over the vocabulary)."""
    header = array.array("i", [0] * 256)
    header[0], header[1], header[2] = 20240520, 1, count
    tokens = array.array("H", ((i * 2654435761) % vocab for i in range(count)))
    with open(path, "wb") as f:
        header.tofile(f)
        tokens.tofile(f)
