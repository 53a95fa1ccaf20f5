#!/usr/bin/python3
"""Independent PyTorch reference for MeshStudio's models.

Reads what `meshstudio-engine dump CONFIG --out DIR` wrote: DIR/checkpoint/{config.json,model.safetensors}
(the weights, Hugging Face GPT-2 names and layouts for gpt, Llama's for llama), DIR/batch.safetensors (the inputs) and
DIR/outputs.safetensors (the engine's logits, loss and gradients "grad.<param>"; for cnn also the BatchNorm
running statistics after the training forward, "buffer.<name>", and its logits are those of an evaluation
forward, BatchNorm with the initial running statistics). Rebuilds the model in
PyTorch from the config alone, in float64, runs the same batch, and compares:

  logits, loss:  |engine - torch| <= atol + rtol * |torch|     (atol 1e-4, rtol 1e-4)
  gradients:     |engine - torch| <= 1e-4 * max|torch grad of that tensor| + 1e-3 * |torch|

The engine computes in float32, the reference in float64, so these tolerances bound float32 rounding through
a few layers. Exit 0 when everything matches, 1 with a per-tensor report otherwise, 2 on unusable input.
Uses only Debian's python3-torch (no safetensors package): the format is parsed here by hand.
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

DTYPES = {"F32": (torch.float32, 4), "I32": (torch.int32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2)}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, size = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype) if end > begin else torch.zeros(0, dtype=dtype)
        out[name] = t.reshape(info["shape"]).clone()
    return out


def layer_norm(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def gelu_tanh(x):
    # GELU, tanh approximation (Hendrycks & Gimpel 2016), as GPT-2 uses it.
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def block(x, p, i, cfg, causal):
    """Pre-LN transformer block with Hugging Face GPT-2 names; linear weights are (in, out)."""
    m = cfg["model"]
    B, T, C = x.shape
    H = m["heads"]
    hs = C // H
    eps = m["layer_norm_eps"]
    pre = f"h.{i}."
    h = layer_norm(x, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], eps)
    qkv = h @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, H, hs).transpose(1, 2)
    k = k.view(B, T, H, hs).transpose(1, 2)
    v = v.view(B, T, H, hs).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    if causal:
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf"))
    att = torch.softmax(att, dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, C)
    x = x + y @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
    h = layer_norm(x, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], eps)
    h = gelu_tanh(h @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"])
    return x + h @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]


def gpt(p, batch, cfg):
    m = cfg["model"]
    tokens = batch["tokens"].long()
    B, T = tokens.shape
    x = p["wte.weight"][tokens] + p["wpe.weight"][:T]
    for i in range(m["layers"]):
        x = block(x, p, i, cfg, causal=True)
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"], m["layer_norm_eps"])
    w = p["wte.weight"] if m["tie_embeddings"] else p["lm_head.weight"]
    logits = x @ w.t()  # (B, T, V)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["targets"].long().reshape(-1))
    return logits, loss


def rms_norm(x, w, eps):
    # RMSNorm (Zhang & Sennrich 2019, eq. 4): x / sqrt(mean(x^2) + eps) * w.
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotary(x, theta):
    """Rotary embeddings (Su et al. 2021) on x (B, heads, T, hs), pairing element i with i + hs/2 (the
    half-split layout of Hugging Face's Llama checkpoints). The angles are computed in float32 as the
    engine (and Hugging Face) compute them, then widened."""
    B, nh, T, hs = x.shape
    inv = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]  # (T, hs/2), float32 products
    cos = torch.cat([ang.double().cos(), ang.double().cos()], -1).float().double()
    sin = torch.cat([ang.double().sin(), ang.double().sin()], -1).float().double()
    x1, x2 = x[..., : hs // 2], x[..., hs // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def swiglu_mlp(h, p, pre):
    return (F.silu(h @ p[pre + "gate_proj.weight"].t()) * (h @ p[pre + "up_proj.weight"].t())) @ p[pre + "down_proj.weight"].t()


def moe_mlp(h, p, pre, m, aux):
    """Mixture of experts written from the config: softmax router, top-k (renormalised), experts' capacity in
    token order (0: dropless), shared experts; appends the load-balancing loss coef * E * sum_e f_e P_e."""
    B, T, C = h.shape
    E, k = m["experts"], m["experts_per_token"]
    x = h.reshape(B * T, C)
    N = x.shape[0]
    probs = torch.softmax(x @ p[pre + "mlp.gate.weight"].t(), dim=-1)  # (N, E)
    top = torch.topk(probs.detach(), k, dim=-1).indices  # (N, k)
    chosen = probs.gather(1, top)
    gates = chosen / chosen.sum(-1, keepdim=True)
    cap = math.ceil(m["capacity_factor"] * N * k / E) if m.get("capacity_factor", 0) > 0 else N
    out = torch.zeros_like(x)
    for e in range(E):
        rows = [(n, s) for n in range(N) for s in range(k) if int(top[n, s]) == e][:cap]
        if not rows:
            continue
        tok = torch.tensor([n for n, _ in rows])
        g = torch.stack([gates[n, s] for n, s in rows]).unsqueeze(1)
        y = swiglu_mlp(x[tok], p, pre + f"mlp.experts.{e}.")
        out = out.index_add(0, tok, g * y)
    if m.get("shared_experts", 0) > 0:
        out = out + swiglu_mlp(x, p, pre + "mlp.shared_experts.")
    counts = torch.zeros(E, dtype=torch.float64)
    for e in range(E):
        counts[e] = float((top == e).sum())
    aux.append(m["aux_loss_coef"] * E * torch.sum(counts / N * probs.mean(0)))
    return out.view(B, T, C)


def llama_block(x, p, i, cfg, aux):
    """A Llama block with Hugging Face names: nn.Linear weights are (out, in), no biases; grouped-query
    attention repeats each key/value head for heads / kv_heads query heads (Ainslie et al. 2023)."""
    m = cfg["model"]
    B, T, C = x.shape
    H = m["heads"]
    KV = m.get("kv_heads", 0) or H
    hs = C // H
    eps = m["layer_norm_eps"]
    pre = f"model.layers.{i}."
    h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
    q = (h @ p[pre + "self_attn.q_proj.weight"].t()).view(B, T, H, hs).transpose(1, 2)
    k = (h @ p[pre + "self_attn.k_proj.weight"].t()).view(B, T, KV, hs).transpose(1, 2)
    v = (h @ p[pre + "self_attn.v_proj.weight"].t()).view(B, T, KV, hs).transpose(1, 2)
    q, k = rotary(q, m["rope_theta"]), rotary(k, m["rope_theta"])
    k = k.repeat_interleave(H // KV, dim=1)
    v = v.repeat_interleave(H // KV, dim=1)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
    y = (att @ v).transpose(1, 2).reshape(B, T, C)
    x = x + y @ p[pre + "self_attn.o_proj.weight"].t()
    h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
    if m.get("experts", 0) > 0 and i >= m.get("dense_layers", 0):
        return x + moe_mlp(h, p, pre, m, aux)
    return x + swiglu_mlp(h, p, pre + "mlp.")


def llama(p, batch, cfg):
    m = cfg["model"]
    tokens = batch["tokens"].long()
    x = p["model.embed_tokens.weight"][tokens]
    aux = []
    for i in range(m["layers"]):
        x = llama_block(x, p, i, cfg, aux)
    x = rms_norm(x, p["model.norm.weight"], m["layer_norm_eps"])
    w = p["model.embed_tokens.weight"] if m["tie_embeddings"] else p["lm_head.weight"]
    logits = x @ w.t()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["targets"].long().reshape(-1))
    if aux:
        # The objective adds the load-balancing losses; the reported loss is the language model's.
        return logits, LossWithAux(loss, sum(aux))
    return logits, loss


class LossWithAux:
    """A language-model loss whose backward also differentiates the mixture of experts' load-balancing loss."""
    def __init__(self, loss, aux):
        self.loss, self.aux = loss, aux

    def backward(self):
        (self.loss + self.aux).backward()

    def detach(self):
        return self.loss.detach()

    def __float__(self):
        return float(self.loss)


def vit(p, batch, cfg):
    m = cfg["model"]
    S, P, C = m["image_size"], m["patch"], m["width"]
    images = batch["images"].to(torch.float64)
    B = images.shape[0]
    g = S // P
    # Patches in row-major order, pixels inside a patch row-major: (B, NP, P*P).
    patches = images.view(B, g, P, g, P).permute(0, 1, 3, 2, 4).reshape(B, g * g, P * P)
    x = patches @ p["patch_embed.weight"] + p["patch_embed.bias"]
    if m["pool"] == "cls":
        x = torch.cat([p["cls_token"].view(1, 1, C).expand(B, 1, C), x], dim=1)
    x = x + p["pos_embed"]
    for i in range(m["layers"]):
        x = block(x, p, i, cfg, causal=False)
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"], m["layer_norm_eps"])
    pooled = x[:, 0] if m["pool"] == "cls" else x.mean(dim=1)
    logits = pooled @ p["head.weight"] + p["head.bias"]
    return logits, F.cross_entropy(logits, batch["targets"].long())


def mlp(p, batch, cfg):
    m = cfg["model"]
    act = {"relu": torch.relu, "gelu": gelu_tanh, "tanh": torch.tanh}[m["activation"]]
    x = batch["images"].to(torch.float64)
    for i in range(len(m["hidden"])):
        x = act(x @ p[f"fc.{i}.weight"] + p[f"fc.{i}.bias"])
    logits = x @ p["head.weight"] + p["head.bias"]
    return logits, F.cross_entropy(logits, batch["targets"].long())


def cnn(p, batch, cfg, buffers_out):
    """A ResNet of basic blocks (He et al. 2016) with torchvision's names, written from the config alone.
    Returns the evaluation logits (BatchNorm with the running statistics: initially mean 0, variance 1) and
    the loss of a training forward (the batch's statistics), which also updates the running statistics
    (buffers_out, as F.batch_norm does: momentum, unbiased variance)."""
    m = cfg["model"]
    S, eps, momentum = m["image_size"], m["bn_eps"], m["bn_momentum"]
    x0 = batch["images"].to(torch.float64).view(-1, 1, S, S)
    bns = [k[:-len(".weight")] for k in p if k.endswith(".weight") and p[k].dim() == 1]

    def forward(training, running):
        def bn(x, name):
            return F.batch_norm(x, running[name + ".running_mean"], running[name + ".running_var"],
                                p[name + ".weight"], p[name + ".bias"], training=training, momentum=momentum,
                                eps=eps)
        h = torch.relu(bn(F.conv2d(x0, p["conv1.weight"], padding=1), "bn1"))
        for s in range(len(m["channels"])):
            for i in range(m["blocks"]):
                pre = f"layer{s + 1}.{i}."
                stride = 2 if s > 0 and i == 0 else 1
                o = torch.relu(bn(F.conv2d(h, p[pre + "conv1.weight"], stride=stride, padding=1), pre + "bn1"))
                o = bn(F.conv2d(o, p[pre + "conv2.weight"], padding=1), pre + "bn2")
                if pre + "downsample.0.weight" in p:
                    h = bn(F.conv2d(h, p[pre + "downsample.0.weight"], stride=stride), pre + "downsample.1") + o
                else:
                    h = h + o
                h = torch.relu(h)
        return h.mean(dim=(2, 3)) @ p["head.weight"] + p["head.bias"]

    def initial():
        r = {}
        for n in bns:
            r[n + ".running_mean"] = torch.zeros(p[n + ".weight"].shape, dtype=torch.float64)
            r[n + ".running_var"] = torch.ones(p[n + ".weight"].shape, dtype=torch.float64)
        return r
    with torch.no_grad():
        logits = forward(False, initial())
    running = initial()
    loss = F.cross_entropy(forward(True, running), batch["targets"].long())
    buffers_out.update(running)
    return logits, loss


def close(engine, ref, atol, rtol):
    err = (engine - ref).abs()
    bound = atol + rtol * ref.abs()
    return bool((err <= bound).all()), float(err.max()) if err.numel() else 0.0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: reference.py DUMP_DIR", file=sys.stderr)
        return 2
    root = argv[0]
    try:
        with open(f"{root}/checkpoint/config.json") as f:
            cfg = json.load(f)
        params = {k: v.to(torch.float64).requires_grad_(True)
                  for k, v in read_safetensors(f"{root}/checkpoint/model.safetensors").items()
                  if not k.endswith((".running_mean", ".running_var"))}
        batch = read_safetensors(f"{root}/batch.safetensors")
        outputs = read_safetensors(f"{root}/outputs.safetensors")
    except (OSError, KeyError, ValueError) as e:
        print(f"reference.py: cannot read the dump in {root}: {e}", file=sys.stderr)
        return 2
    buffers = {}
    if cfg["model"]["type"] == "cnn":
        logits, loss = cnn(params, batch, cfg, buffers)
    else:
        logits, loss = {"gpt": gpt, "llama": llama, "vit": vit, "mlp": mlp}[cfg["model"]["type"]](params, batch, cfg)
    loss.backward()

    failures = []
    ok, err = close(outputs["logits"].double(), logits.detach(), 1e-4, 1e-4)
    print(f"logits       max err {err:.3e} {'ok' if ok else 'MISMATCH'}")
    if not ok:
        failures.append("logits")
    ok, err = close(outputs["loss"].double(), loss.detach().view(1), 1e-5, 1e-5)
    print(f"loss         engine {float(outputs['loss'][0]):.7f} torch {float(loss):.7f} {'ok' if ok else 'MISMATCH'}")
    if not ok:
        failures.append("loss")
    for name, p in sorted(params.items()):
        ref = p.grad
        eng = outputs.get("grad." + name)
        if eng is None:
            failures.append("grad." + name + " (missing)")
            continue
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        ok, err = close(eng.double(), ref, 1e-4 * scale + 1e-9, 1e-3)
        print(f"grad {name:32s} max err {err:.3e} (max |g| {scale:.3e}) {'ok' if ok else 'MISMATCH'}")
        if not ok:
            failures.append("grad." + name)
    # The BatchNorm running statistics after the training forward (the engine's float32 sums in double).
    for name, ref in sorted(buffers.items()):
        eng = outputs.get("buffer." + name)
        if eng is None:
            failures.append("buffer." + name + " (missing)")
            continue
        ok, err = close(eng.double(), ref, 1e-5, 1e-5)
        print(f"buffer {name:30s} max err {err:.3e} {'ok' if ok else 'MISMATCH'}")
        if not ok:
            failures.append("buffer." + name)
    if failures:
        print("reference mismatch: " + ", ".join(failures))
        return 1
    print(f"all {2 + len(params) + len(buffers)} tensors match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
