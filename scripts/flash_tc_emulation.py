#!/usr/bin/python3
# A design check, not a test of the CUDA code itself (it cannot run the kernel): written with the tensor-core
# attention kernel while no GPU was available, it mirrors that kernel's loops and must be kept in step with it
# by hand. Run: /usr/bin/python3 scripts/flash_tc_emulation.py (about a minute; prints "FAIL" on a mismatch).
#
# Host emulation of kernels/cuda/cuda_flash_attention_tc.cu's loop structure (blocks, warps, chunks, lanes),
# wmma replaced by numpy 16x16 products in fp32 on bf16 values, accumulators stored under a random
# (lane, slot) <-> (row, col) permutation to exercise the rowOf trick. Checks against float64 attention.
import numpy as np, sys
rng = np.random.default_rng(1)
kWarps, kStrip, kRows, kCols = 4, 16, 64, 64
kChunks = kCols // kStrip

def bf16(x):
    x = np.asarray(x, dtype=np.float32).copy()
    u = x.view(np.uint32).astype(np.uint64)
    rest = u & np.uint64(0xffff)
    r = u - rest
    up = (rest > 0x8000) | ((rest == 0x8000) & ((r & np.uint64(0x10000)) != 0))
    r = r + up.astype(np.uint64) * np.uint64(0x10000)
    return (r & np.uint64(0xffffffff)).astype(np.uint32).view(np.float32).reshape(x.shape)

PERM = rng.permutation(256)  # slot s (lane*8+e) holds element PERM[s] (row = PERM//16, col = PERM%16)
class Acc:
    def __init__(self): self.x = np.zeros(256, np.float32)
    def load(self, mat):  # mat 16x16 row-major
        self.x = mat.reshape(-1)[PERM].astype(np.float32).copy()
    def store(self):
        m = np.zeros(256, np.float32); m[PERM] = self.x; return m.reshape(16, 16)
    def mma(self, a, b):  # a, b 16x16 bf16-valued
        m = self.store(); m = (m.astype(np.float64) + a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
        self.load(m)

def visible(i, j, T, causal): return j < T and (not causal or j <= i)

def loadTile(src, r0, T, D):  # src (T, D) fp32
    t = np.zeros((kCols, D), np.float32)
    n = max(0, min(T - r0, kCols))
    if n > 0: t[:n] = bf16(src[r0:r0 + n])
    return t

def forward(q, k, v, T, D, causal, scale):
    out = np.full((T, D), 5.0, np.float32); lse = np.full(T, 5.0, np.float32)
    rowTable = np.repeat(np.arange(16, dtype=np.float32), 16).reshape(16, 16)
    for by in range((T + kRows - 1) // kRows):
        i0 = by * kRows
        qS = loadTile(q, i0, T, D)
        warps = []
        for w in range(kWarps):
            rowOf = Acc(); rowOf.load(rowTable)
            warps.append(dict(o=[Acc() for _ in range(D // 16)], m=np.full(16, -np.inf, np.float32), l=np.zeros(16, np.float32), rowOf=rowOf))
        keys = min(T, i0 + kRows) if causal else T
        for j0 in range(0, keys, kCols):
            kS = loadTile(k, j0, T, D); vS = loadTile(v, j0, T, D)
            for w in range(kWarps):
                W = warps[w]; w0 = i0 + w * kStrip
                if not (w0 < T): continue
                warpKeys = min(T, w0 + kStrip) if causal else T
                chunks = min(kChunks, (warpKeys - j0 + kStrip - 1) // kStrip)
                assert chunks >= 1
                sW = np.full((16, kCols), np.nan, np.float32)  # unwritten = NaN: must never be read
                for c in range(chunks):
                    s = Acc()
                    for kk in range(D // 16):
                        s.mma(qS[w*16:(w+1)*16, kk*16:(kk+1)*16], kS[c*16:(c+1)*16, kk*16:(kk+1)*16].T)
                    sW[:, c*16:(c+1)*16] = s.store()
                pW = np.full((16, kCols), np.nan, np.float32); alphaW = np.zeros(16, np.float32)
                for r in range(16):
                    i = w0 + r
                    tmax = -np.inf
                    for col in range(kCols):
                        if visible(i, j0 + col, T, causal):
                            assert not np.isnan(sW[r, col]), (i, j0 + col)
                            tmax = max(tmax, np.float32(sW[r, col] * np.float32(scale)))
                    mNew = max(W['m'][r], tmax); alpha = np.float32(1); ssum = np.float32(0)
                    if mNew == -np.inf:
                        pW[r, :] = 0
                    else:
                        alpha = np.float32(np.exp(np.float32(W['m'][r] - mNew)))
                        for col in range(kCols):
                            p = np.float32(np.exp(np.float32(sW[r, col] * np.float32(scale)) - mNew)) if visible(i, j0 + col, T, causal) else np.float32(0)
                            pW[r, col] = bf16(p); ssum += p
                    W['l'][r] = W['l'][r] * alpha + ssum; W['m'][r] = mNew; alphaW[r] = alpha
                for n in range(D // 16):
                    W['o'][n].x *= alphaW[W['rowOf'].x.astype(int)]
                for c in range(chunks):
                    pa = pW[:, c*16:(c+1)*16]
                    assert not np.isnan(pa).any()
                    for n in range(D // 16):
                        W['o'][n].mma(pa, vS[c*16:(c+1)*16, n*16:(n+1)*16])
        for w in range(kWarps):
            W = warps[w]; w0 = i0 + w * kStrip
            if not (w0 < T): continue
            inv = np.where(W['l'] > 0, 1 / np.maximum(W['l'], 1e-30), 0).astype(np.float32)
            for r in range(16):
                if w0 + r < T: lse[w0 + r] = W['m'][r] + np.log(W['l'][r]) if W['l'][r] > 0 else np.inf
            for n in range(D // 16): W['o'][n].x *= inv[W['rowOf'].x.astype(int)]
            stage = np.concatenate([W['o'][n].store() for n in range(D // 16)], axis=1)
            for rr in range(16):
                if w0 + rr < T: out[w0 + rr] = stage[rr]
    return out, lse

def backward(q, k, v, g, out, lse, dq, dk, dv, T, D, causal, scale):
    Dvec = (bf16(g).astype(np.float32) * out).sum(1).astype(np.float32)
    nb = (T + kRows - 1) // kRows
    for by in range(nb):  # KV kernel
        j0 = by * kRows
        kS = loadTile(k, j0, T, D); vS = loadTile(v, j0, T, D)
        dK = [np.zeros((16, D), np.float32) for _ in range(kWarps)]; dV = [np.zeros((16, D), np.float32) for _ in range(kWarps)]
        first = j0 if causal else 0
        for iq0 in range(first, T, kCols):
            qS = loadTile(q, iq0, T, D); gS = loadTile(g, iq0, T, D)
            lseS = np.array([lse[iq0 + t] if iq0 + t < T else np.inf for t in range(kCols)], np.float32)
            dotS = np.array([Dvec[iq0 + t] if iq0 + t < T else 0 for t in range(kCols)], np.float32)
            for w in range(kWarps):
                w0 = j0 + w * 16
                if not (w0 < T): continue
                for c in range(kChunks):
                    q0 = iq0 + c * 16
                    if q0 >= T: break
                    if causal and q0 + 15 < w0: continue
                    st = np.zeros((16, 16), np.float32); dpt = np.zeros((16, 16), np.float32)
                    for kk in range(D // 16):
                        st += kS[w*16:(w+1)*16, kk*16:(kk+1)*16] @ qS[c*16:(c+1)*16, kk*16:(kk+1)*16].T
                        dpt += vS[w*16:(w+1)*16, kk*16:(kk+1)*16] @ gS[c*16:(c+1)*16, kk*16:(kk+1)*16].T
                    pT = np.zeros((16, 16), np.float32); dsT = np.zeros((16, 16), np.float32)
                    for e in range(256):
                        rr, cc = e // 16, e % 16
                        if q0 + cc < T and visible(q0 + cc, w0 + rr, T, causal):
                            p = np.float32(np.exp(np.float32(st[rr, cc] * np.float32(scale)) - lseS[c*16 + cc]))
                            ds = np.float32(p * (dpt[rr, cc] - dotS[c*16 + cc]))
                            pT[rr, cc] = bf16(p); dsT[rr, cc] = bf16(ds)
                    dV[w] += pT @ gS[c*16:(c+1)*16]
                    dK[w] += dsT @ qS[c*16:(c+1)*16]
        for w in range(kWarps):
            w0 = j0 + w * 16
            if not (w0 < T): continue
            for rr in range(16):
                j = w0 + rr
                if j >= T: continue
                dk[j] += np.float32(scale) * dK[w][rr]; dv[j] += dV[w][rr]
    for by in range(nb):  # Q kernel
        i0 = by * kRows
        qS = loadTile(q, i0, T, D); gS = loadTile(g, i0, T, D)
        lseS = np.array([lse[i0 + t] if i0 + t < T else np.inf for t in range(kRows)], np.float32)
        dotS = np.array([Dvec[i0 + t] if i0 + t < T else 0 for t in range(kRows)], np.float32)
        dQ = [np.zeros((16, D), np.float32) for _ in range(kWarps)]
        keys = min(T, i0 + kRows) if causal else T
        for j0 in range(0, keys, kCols):
            kS = loadTile(k, j0, T, D); vS = loadTile(v, j0, T, D)
            for w in range(kWarps):
                w0 = i0 + w * 16
                if not (w0 < T): continue
                warpKeys = min(T, w0 + 16) if causal else T
                chunks = min(kChunks, (warpKeys - j0 + 15) // 16)
                assert chunks >= 1
                for c in range(chunks):
                    k0 = j0 + c * 16
                    s = qS[w*16:(w+1)*16] @ kS[c*16:(c+1)*16].T
                    dp = gS[w*16:(w+1)*16] @ vS[c*16:(c+1)*16].T
                    ds_ = np.zeros((16, 16), np.float32)
                    for e in range(256):
                        rr, cc = e // 16, e % 16
                        if w0 + rr < T and visible(w0 + rr, k0 + cc, T, causal):
                            p = np.float32(np.exp(np.float32(s[rr, cc] * np.float32(scale)) - lseS[w*16 + rr]))
                            ds_[rr, cc] = bf16(np.float32(p * (dp[rr, cc] - dotS[w*16 + rr])))
                    dQ[w] += ds_ @ kS[c*16:(c+1)*16]
        for w in range(kWarps):
            w0 = i0 + w * 16
            if not (w0 < T): continue
            for rr in range(16):
                if w0 + rr < T: dq[w0 + rr] += np.float32(scale) * dQ[w][rr]

def reference(q, k, v, g, T, D, causal, scale):
    q, k, v, g = [bf16(x).astype(np.float64) for x in (q, k, v, g)]
    s = q @ k.T * scale
    if causal: s = np.where(np.tril(np.ones((T, T))) > 0, s, -np.inf)
    mx = s.max(1, keepdims=True); p = np.exp(s - mx); l = p.sum(1, keepdims=True); P = p / l
    out = P @ v; lse = (mx + np.log(l))[:, 0]
    dP = g @ v.T; dv = P.T @ g
    dS = P * (dP - (dP * P).sum(1, keepdims=True))
    dq = dS @ k * scale; dk = dS.T @ q * scale
    return out, lse, dq, dk, dv

worst = 0
for (T, D, causal) in [(1, 16, True), (1, 64, False), (37, 32, True), (37, 64, False), (100, 64, True), (100, 16, False),
                       (130, 32, True), (130, 32, False), (64, 16, True), (128, 16, True), (257, 16, True), (200, 48, False)]:
    scale = np.float32(1 / np.sqrt(np.float32(D)))
    q, k, v = [rng.uniform(-2, 2, (T, D)).astype(np.float32) for _ in range(3)]
    g = rng.uniform(-1, 1, (T, D)).astype(np.float32)
    out, lse = forward(q, k, v, T, D, causal, scale)
    dq0, dk0, dv0 = [rng.uniform(-1, 1, (T, D)).astype(np.float32) for _ in range(3)]
    dq, dk, dv = dq0.copy(), dk0.copy(), dv0.copy()
    backward(q, k, v, g, out, lse, dq, dk, dv, T, D, causal, scale)
    ro, rl, rdq, rdk, rdv = reference(q, k, v, g, T, D, causal, float(scale))
    errs = dict(out=np.abs(out - ro).max(), lse=np.abs(lse - rl).max(), dq=np.abs(dq - dq0 - rdq).max(),
                dk=np.abs(dk - dk0 - rdk).max(), dv=np.abs(dv - dv0 - rdv).max())
    ok = errs['lse'] < 1e-4 * (1 + np.abs(rl).max()) and all(errs[x] < 2e-2 for x in ('out', 'dq', 'dk', 'dv'))
    worst = max(worst, max(errs[x] for x in ('out', 'dq', 'dk', 'dv')))
    print(T, D, causal, {k_: f"{v_:.2e}" for k_, v_ in errs.items()}, "ok" if ok else "FAIL"); sys.stdout.flush()
print("worst", worst)
