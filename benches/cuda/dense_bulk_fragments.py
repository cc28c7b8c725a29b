"""CPU check of kernels/dense_bulk.cu's fragment addressing (no GPU needed).

Emulates ldmatrix (x4, with and without .trans) and mma.sync m16n8k16 / m16n8k8 with the PTX
ISA's fragment layouts (lane = 4 g + t) on numpy arrays laid out as the kernel's shared memory,
runs dw_tile and dx_tile's address arithmetic as the kernel writes it, and compares the tiles
with plain matmuls. It mirrors the kernel by hand: change both together.
Run: python3 benches/cuda/dense_bulk_fragments.py (needs numpy).
"""
import numpy as np

XP = 24  # Db<T>::XP: the pitch of a staged x segment, in elements


def ldsm(arr, addrs, trans):
    """ldmatrix.x4: lane 8 q + j gives row j of matrix q; lane 4 g + t gets (g, 2t..2t+1)."""
    regs = [[None] * 4 for _ in range(32)]
    for q in range(4):
        rows = [arr[r, c:c + 8] for r, c in (addrs[8 * q + j] for j in range(8))]
        mat = np.stack(rows).T if trans else np.stack(rows)
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            regs[lane][q] = (mat[g, 2 * t], mat[g, 2 * t + 1])
    return regs


def mma(d, a, b, k16):
    """d += A B from per-lane fragments (k16: m16n8k16 pairs, else m16n8k8 TF32 scalars)."""
    kk = 16 if k16 else 8
    A, B = np.zeros((16, kk)), np.zeros((kk, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        if k16:
            A[g, 2 * t:2 * t + 2], A[g + 8, 2 * t:2 * t + 2] = a[lane][0], a[lane][1]
            A[g, 2 * t + 8:2 * t + 10], A[g + 8, 2 * t + 8:2 * t + 10] = a[lane][2], a[lane][3]
            B[2 * t:2 * t + 2, g], B[2 * t + 8:2 * t + 10, g] = b[lane]
        else:
            A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4] = a[lane]
            B[t, g], B[t + 4, g] = b[lane]
    D = A @ B
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        d[lane] += [D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]]


def store(out, acc, row0, col):
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        c = col + 2 * t
        out[row0 + g, c:c + 2], out[row0 + g + 8, c:c + 2] = acc[lane][:2], acc[lane][2:]


def store_dw(dwt, acc, c0, ns):
    """A warp's two 8-column slices c0, c0 + 1 of the tile's dw, those below ns."""
    for c in range(2):
        if c0 + c < ns:
            store(dwt, acc[c], 0, 8 * (c0 + c))


def tiles_16bit(xs, dys, old, m, n):
    mp, ns = xs.shape[0], n // 8
    dwt, dx = np.zeros((16, n + 8)), np.zeros((mp, 16))
    for warp in range(8):
        c0 = 2 * warp
        if c0 >= ns:
            continue
        acc = [np.zeros((32, 4)), np.zeros((32, 4))]
        for kb in range(mp // 16):
            xa = [((l >> 4) * 8 + (l & 7) + 16 * kb, ((l >> 3) & 1) * 8) for l in range(32)]
            ya = [(((l >> 3) & 1) * 8 + (l & 7) + 16 * kb, 8 * (c0 + (l >> 4))) for l in range(32)]
            a, b = ldsm(xs, xa, True), ldsm(dys, ya, True)
            mma(acc[0], a, [(r[0], r[1]) for r in b], True)
            if c0 + 1 < ns:
                mma(acc[1], a, [(r[2], r[3]) for r in b], True)
        store_dw(dwt, acc, c0, ns)
    for mt in range(8):
        if 16 * mt >= m:
            continue
        d = [np.zeros((32, 4)), np.zeros((32, 4))]
        for kk in range((n + 15) // 16):
            ya = [(16 * mt + ((l >> 3) & 1) * 8 + (l & 7), (l >> 4) * 8 + 16 * kk) for l in range(32)]
            oa = [((l >> 4) * 8 + (l & 7), ((l >> 3) & 1) * 8 + 16 * kk) for l in range(32)]
            a, b = ldsm(dys, ya, False), ldsm(old, oa, False)
            mma(d[0], a, [(r[0], r[1]) for r in b], True)
            mma(d[1], a, [(r[2], r[3]) for r in b], True)
        for c in range(2):
            store(dx, d[c], 16 * mt, 8 * c)
    return dwt[:, :n], dx[:m]


def tiles_tf32(xs, dys, old, m, n):
    mp, ns = xs.shape[0], n // 8
    dwt, dx = np.zeros((16, n + 8)), np.zeros((mp, 16))
    for warp in range(8):
        c0 = 2 * warp
        acc = [np.zeros((32, 4)), np.zeros((32, 4))]
        for kb in range(mp // 8):
            a, bs = [], [[], []]
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                x0, x1 = xs[8 * kb + t], xs[8 * kb + t + 4]
                a.append((x0[g], x0[g + 8], x1[g], x1[g + 8]))
                for i in range(2):
                    col = min(8 * (c0 + i) + g, n + 7)
                    bs[i].append((dys[8 * kb + t, col], dys[8 * kb + t + 4, col]))
            for i in range(2):
                if c0 + i < ns:
                    mma(acc[i], a, bs[i], False)
        store_dw(dwt, acc, c0, ns)
    for mt in range(8):
        if 16 * mt >= m:
            continue
        d = [np.zeros((32, 4)), np.zeros((32, 4))]
        for kk in range(n // 8):
            a, b0, b1 = [], [], []
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                j = 8 * kk + 2 * t  # K permuted: logical t, t + 4 are columns 2t, 2t + 1
                lo, hi = dys[16 * mt + g, j:j + 2], dys[16 * mt + g + 8, j:j + 2]
                a.append((lo[0], hi[0], lo[1], hi[1]))
                b0.append(tuple(old[g, j:j + 2]))
                b1.append(tuple(old[g + 8, j:j + 2]))
            mma(d[0], a, b0, False)
            mma(d[1], a, b1, False)
        for c in range(2):
            store(dx, d[c], 16 * mt, 8 * c)
    return dwt[:, :n], dx[:m]


def main():
    rng = np.random.default_rng(0)
    for m, n in [(37, 40), (100, 128), (1, 8), (10, 120), (128, 64)]:
        mp = (m + 15) & ~15
        xs = np.zeros((mp, XP))
        xs[:m, :16] = rng.standard_normal((m, 16))
        dys = np.zeros((mp, n + 8))
        dys[:m, :n] = rng.standard_normal((m, n))
        old = np.zeros((16, n + 8))
        old[:, :n] = rng.standard_normal((16, n))
        want_dw, want_dx = xs[:m, :16].T @ dys[:m, :n], dys[:m, :n] @ old[:, :n].T
        for name, tiles in [("16-bit", tiles_16bit), ("tf32", tiles_tf32)]:
            dw, dx = tiles(xs, dys, old, m, n)
            err = max(np.abs(dw - want_dw).max(), np.abs(dx - want_dx).max())
            print(f"{name} m={m} n={n}: max error {err:.2e}")
            assert err < 1e-9, f"{name} m={m} n={n}"


if __name__ == "__main__":
    main()
