"""The Triton kernels of ``triton_scan.py`` (imported only when a scan runs on the GPU); the equations and the
design are in that module's docstring."""

import triton
import triton.language as tl


@triton.jit
def softplus(x):
    return tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))  # log1p(exp(x)) without overflow


@triton.jit
def sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def load_row(u_ptr, dl_ptr, B_ptr, C_ptr, z_ptr, row, DM, N, offs_d, offs_n, md, mn, ok, HAS_Z: tl.constexpr):
    """Position ``row`` (batch row x t + position) of u, Δ, B, C and z; zeros where ``ok`` is false."""
    u = tl.load(u_ptr + row * DM + offs_d, mask=md & ok, other=0.0)
    dt = tl.load(dl_ptr + row * DM + offs_d, mask=md & ok, other=0.0)
    Bt = tl.load(B_ptr + row * N + offs_n, mask=mn & ok, other=0.0)
    Ct = tl.load(C_ptr + row * N + offs_n, mask=mn & ok, other=0.0)
    z = tl.load(z_ptr + row * DM + offs_d, mask=md & ok, other=0.0) if HAS_Z else u
    return u, dt, Bt, Ct, z


@triton.jit
def scan_fwd(
    u_ptr, dl_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, h0_ptr,  # inputs
    y_ptr, hlast_ptr, bounds_ptr,  # outputs
    T, DM, N, n_chunks,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_H0: tl.constexpr,
    SOFTPLUS: tl.constexpr, CHUNK, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_b = tl.program_id(0).to(tl.int64)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    md, mn = offs_d < DM, offs_n < N
    mdn = md[:, None] & mn[None, :]
    dn = offs_d[:, None] * N + offs_n[None, :]  # (BLOCK_D, BLOCK_N) offsets into a (d, n) matrix
    A = tl.load(A_ptr + dn, mask=mdn, other=0.0)  # padded entries: A = 0, B = C = 0 keep h = 0 there
    if HAS_D:
        Dv = tl.load(D_ptr + offs_d, mask=md, other=0.0)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_d, mask=md, other=0.0)
    if HAS_H0:
        h = tl.load(h0_ptr + pid_b * DM * N + dn, mask=mdn, other=0.0)
    else:
        h = tl.zeros([BLOCK_D, BLOCK_N], dtype=A.dtype)
    base = pid_b * T
    nu, ndt, nB, nC, nz = load_row(
        u_ptr, dl_ptr, B_ptr, C_ptr, z_ptr, base, DM, N, offs_d, offs_n, md, mn, True, HAS_Z
    )
    for s in range(0, T):
        if s % CHUNK == 0:
            tl.store(bounds_ptr + (pid_b * n_chunks + s // CHUNK) * DM * N + dn, h, mask=mdn)
        row = base + s
        u, dt, Bt, Ct, z = nu, ndt, nB, nC, nz  # loaded during the last step: the next row's loads go out now
        nu, ndt, nB, nC, nz = load_row(
            u_ptr, dl_ptr, B_ptr, C_ptr, z_ptr, row + 1, DM, N, offs_d, offs_n, md, mn, s + 1 < T, HAS_Z
        )
        if HAS_BIAS:
            dt += bias
        if SOFTPLUS:
            dt = softplus(dt)
        h = tl.exp(dt[:, None] * A) * h + (dt * u)[:, None] * Bt[None, :]
        y = tl.sum(h * Ct[None, :], axis=1)
        if HAS_D:
            y += Dv * u
        if HAS_Z:
            y *= z * sigmoid(z)
        tl.store(y_ptr + row * DM + offs_d, y, mask=md)
    tl.store(hlast_ptr + pid_b * DM * N + dn, h, mask=mdn)


@triton.jit
def recompute_chunk(
    h, scratch, local, u_ptr, dl_ptr, B_ptr, A, bias, row, length, DM, N, offs_d, offs_n, md, mn,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The chunk's states again from h, the one entering it: scratch[i] = h_{start + i - 1}, i = 0 .. length."""
    tl.store(scratch + local, h)
    nu = tl.load(u_ptr + row * DM + offs_d, mask=md, other=0.0)
    ndt = tl.load(dl_ptr + row * DM + offs_d, mask=md, other=0.0)
    nB = tl.load(B_ptr + row * N + offs_n, mask=mn, other=0.0)
    for i in range(0, length):
        u, dt, Bt = nu, ndt, nB  # loaded during the last step: the next row's loads go out now
        ok = i + 1 < length
        nu = tl.load(u_ptr + (row + i + 1) * DM + offs_d, mask=md & ok, other=0.0)
        ndt = tl.load(dl_ptr + (row + i + 1) * DM + offs_d, mask=md & ok, other=0.0)
        nB = tl.load(B_ptr + (row + i + 1) * N + offs_n, mask=mn & ok, other=0.0)
        if HAS_BIAS:
            dt += bias
        if SOFTPLUS:
            dt = softplus(dt)
        h = tl.exp(dt[:, None] * A) * h + (dt * u)[:, None] * Bt[None, :]
        tl.store(scratch + (i + 1) * BLOCK_D * BLOCK_N + local, h)


@triton.jit
def adjoint_chunk(
    lam, dA_acc, dD_acc, dbias_acc, scratch, local, row0, length, pid_d, n_blocks, DM, N, offs_d, offs_n, md, mn,
    u_ptr, dl_ptr, A, B_ptr, C_ptr, Dv, z_ptr, bias, dy_ptr, du_ptr, ddl_ptr, dz_ptr, dB_ptr, dC_ptr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The adjoint recurrence backwards through one chunk (rows row0 .. row0 + length - 1), the states from the
    scratch; writes du, dΔ, dz and the block's dB, dC terms; returns the adjoint and the accumulators."""
    last = row0 + length - 1
    nu, npre, nB, nC, nz = load_row(
        u_ptr, dl_ptr, B_ptr, C_ptr, z_ptr, last, DM, N, offs_d, offs_n, md, mn, True, HAS_Z
    )
    ng = tl.load(dy_ptr + last * DM + offs_d, mask=md, other=0.0)
    for j in range(0, length):
        i = length - 1 - j
        row = row0 + i
        u, pre, Bt, Ct, z, g = nu, npre, nB, nC, nz, ng  # loaded one step ahead, as in the forward
        ok = i > 0
        nu, npre, nB, nC, nz = load_row(
            u_ptr, dl_ptr, B_ptr, C_ptr, z_ptr, row - 1, DM, N, offs_d, offs_n, md, mn, ok, HAS_Z
        )
        ng = tl.load(dy_ptr + (row - 1) * DM + offs_d, mask=md & ok, other=0.0)
        if HAS_BIAS:
            pre += bias
        dt = softplus(pre) if SOFTPLUS else pre
        h_prev = tl.load(scratch + i * BLOCK_D * BLOCK_N + local)
        h_t = tl.load(scratch + (i + 1) * BLOCK_D * BLOCK_N + local)
        if HAS_Z:
            y = tl.sum(h_t * Ct[None, :], axis=1)
            if HAS_D:
                y += Dv * u
            sz = sigmoid(z)
            tl.store(dz_ptr + row * DM + offs_d, g * y * sz * (1.0 + z * (1.0 - sz)), mask=md)
            g = g * z * sz
        lam += g[:, None] * Ct[None, :]
        tl.store(dC_ptr + (row * n_blocks + pid_d) * N + offs_n, tl.sum(g[:, None] * h_t, axis=0), mask=mn)
        tl.store(
            dB_ptr + (row * n_blocks + pid_d) * N + offs_n, tl.sum(lam * (dt * u)[:, None], axis=0), mask=mn
        )
        dA_t = tl.exp(dt[:, None] * A)
        lam_B = tl.sum(lam * Bt[None, :], axis=1)
        du = lam_B * dt
        if HAS_D:
            du += Dv * g
            dD_acc += g * u
        w = lam * dA_t * h_prev
        ddt = tl.sum(w * A, axis=1) + u * lam_B
        dA_acc += w * dt[:, None]
        if SOFTPLUS:
            ddt = ddt * sigmoid(pre)
        dbias_acc += ddt
        tl.store(du_ptr + row * DM + offs_d, du, mask=md)
        tl.store(ddl_ptr + row * DM + offs_d, ddt, mask=md)
        lam = lam * dA_t
    return lam, dA_acc, dD_acc, dbias_acc


@triton.jit
def scan_bwd(
    u_ptr, dl_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, bounds_ptr, dy_ptr, dhlast_ptr,  # inputs
    du_ptr, ddl_ptr, dz_ptr, dB_ptr, dC_ptr, dA_ptr, dD_ptr, dbias_ptr, dh0_ptr, scratch_ptr,  # outputs
    T, DM, N, n_chunks, n_blocks,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
    SOFTPLUS: tl.constexpr, CHUNK, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_b = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    md, mn = offs_d < DM, offs_n < N
    mdn = md[:, None] & mn[None, :]
    dn = offs_d[:, None] * N + offs_n[None, :]
    local = tl.arange(0, BLOCK_D)[:, None] * BLOCK_N + offs_n[None, :]  # one state's place in the scratch
    scratch = scratch_ptr + (pid_b * n_blocks + pid_d) * (CHUNK + 1) * BLOCK_D * BLOCK_N
    A = tl.load(A_ptr + dn, mask=mdn, other=0.0)
    Dv = tl.load(D_ptr + offs_d, mask=md & HAS_D, other=0.0)
    bias = tl.load(bias_ptr + offs_d, mask=md & HAS_BIAS, other=0.0)
    lam = tl.load(dhlast_ptr + pid_b * DM * N + dn, mask=mdn, other=0.0)  # the state's adjoint
    dA_acc = tl.zeros([BLOCK_D, BLOCK_N], dtype=A.dtype)
    dD_acc = tl.zeros([BLOCK_D], dtype=A.dtype)
    dbias_acc = tl.zeros([BLOCK_D], dtype=A.dtype)
    for cc in range(0, n_chunks):
        c = n_chunks - 1 - cc
        row0 = pid_b * T + c * CHUNK
        length = tl.minimum(c * CHUNK + CHUNK, T) - c * CHUNK
        h = tl.load(bounds_ptr + (pid_b * n_chunks + c) * DM * N + dn, mask=mdn, other=0.0)
        recompute_chunk(
            h, scratch, local, u_ptr, dl_ptr, B_ptr, A, bias, row0, length, DM, N, offs_d, offs_n, md, mn,
            HAS_BIAS, SOFTPLUS, BLOCK_D, BLOCK_N,
        )  # fmt: skip
        tl.debug_barrier()
        lam, dA_acc, dD_acc, dbias_acc = adjoint_chunk(
            lam, dA_acc, dD_acc, dbias_acc, scratch, local, row0, length, pid_d, n_blocks, DM, N, offs_d, offs_n,
            md, mn, u_ptr, dl_ptr, A, B_ptr, C_ptr, Dv, z_ptr, bias, dy_ptr, du_ptr, ddl_ptr, dz_ptr, dB_ptr,
            dC_ptr, HAS_D, HAS_Z, HAS_BIAS, SOFTPLUS, BLOCK_D, BLOCK_N,
        )  # fmt: skip
        tl.debug_barrier()  # the next chunk overwrites the scratch
    tl.store(dh0_ptr + pid_b * DM * N + dn, lam, mask=mdn)
    tl.store(dA_ptr + pid_b * DM * N + dn, dA_acc, mask=mdn)
    tl.store(dD_ptr + pid_b * DM + offs_d, dD_acc, mask=md)
    tl.store(dbias_ptr + pid_b * DM + offs_d, dbias_acc, mask=md)
