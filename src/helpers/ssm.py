"""Hidden attention of SSM heads: the matrix alpha with y = alpha @ x that unrolling a
selective scan gives (Ali, Zimerman, Wolf 2024), for Mamba-1, Mamba-2 (SSD) and Llamba's
DiscreteMamba2 heads, with no loop over time.

For an SSD head, alpha[t, s] = (C_t . B_s) * dt_s * exp(A * sum_{k=s+1..t} dt_k) for s <= t.
Decays are summed and exponentiated in float32 whatever the model's dtype (in bf16 a long sum of
small log-decays loses most of its digits), and the segment sums are taken the numerically
stable way: mask first, then a cumulative sum, never a difference of two long cumulative sums.
Shapes: b batch, T time, h heads, n state, c channels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def wide(x: torch.Tensor) -> torch.Tensor:
    """x in float32, or kept in float64: the precision hidden attention is computed in."""
    return x if x.dtype == torch.float64 else x.float()


def segment_sum(x: torch.Tensor) -> torch.Tensor:
    """out[..., t, s] = sum_{k=s+1..t} x[..., k] for s <= t, -inf above the diagonal (`wide`).

    Each entry is summed from its own terms (mask the terms outside s+1..t, then a cumulative
    sum down the rows), not as a difference of two cumulative sums, which cancels badly."""
    T = x.shape[-1]
    x = wide(x)[..., :, None].expand(*x.shape, T)  # [..., t, s] = x[..., t]
    below = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-1)
    out = torch.cumsum(x.masked_fill(~below, 0.0), dim=-2)
    return out.masked_fill(
        ~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), float("-inf")
    )


def ssd_hidden_attention(
    C: torch.Tensor, B: torch.Tensor, dt: torch.Tensor, A: torch.Tensor
) -> torch.Tensor:
    """alpha [batch, heads, T, T] of SSD heads. C, B: [batch, T, heads, state] (groups already
    expanded to heads); dt: [batch, T, heads] after softplus; A: [heads] (negative)."""
    dt = wide(dt)
    decay = torch.exp(segment_sum((dt * A).transpose(1, 2)))  # [b, h, T, T]
    cb = torch.einsum("bthn,bshn->bhts", wide(C), wide(B))
    return cb * decay * dt.transpose(1, 2)[:, :, None, :]


def mamba2_terms(mixer, u: torch.Tensor) -> dict[str, torch.Tensor]:
    """x, B, C, dt, A, z of a transformers Mamba2Mixer on input `u` [batch, T, hidden]
    (the same steps as the mixer's own torch path, with no cache)."""
    T = u.shape[1]
    z, xbc, dt = mixer.in_proj(u).split(
        [mixer.intermediate_size, mixer.conv_dim, mixer.num_heads], dim=-1
    )
    xbc = mixer.act(mixer.conv1d(xbc.transpose(1, 2))[..., :T].transpose(1, 2))
    g, n = mixer.n_groups, mixer.ssm_state_size
    x, B, C = xbc.split([mixer.intermediate_size, g * n, g * n], dim=-1)
    rep = mixer.num_heads // g
    dt = F.softplus(dt + mixer.dt_bias)
    lo, hi = mixer.time_step_limit
    return dict(
        x=x.reshape(*x.shape[:2], mixer.num_heads, mixer.head_dim),
        B=B.reshape(*B.shape[:2], g, n).repeat_interleave(rep, dim=2),
        C=C.reshape(*C.shape[:2], g, n).repeat_interleave(rep, dim=2),
        dt=dt.clamp(lo, hi),
        A=-torch.exp(mixer.A_log.float()),
        z=z,
    )


def mamba1_terms(mixer, u: torch.Tensor) -> dict[str, torch.Tensor]:
    """x, B, C, dt, A, z of a transformers MambaMixer / FalconMambaMixer on input `u`:
    x, dt, z [batch, T, channels]; B, C [batch, T, state]; A [channels, state] (negative).
    Falcon-Mamba normalises B, C and dt (weightless RMS norms) before use."""
    T = u.shape[1]
    x, z = mixer.in_proj(u).chunk(2, dim=-1)
    x = mixer.act(mixer.conv1d(x.transpose(1, 2))[..., :T]).transpose(1, 2)
    dt, B, C = mixer.x_proj(x).split(
        [mixer.time_step_rank, mixer.ssm_state_size, mixer.ssm_state_size], dim=-1
    )
    if hasattr(mixer, "b_layernorm"):
        dt, B, C = mixer.dt_layernorm(dt), mixer.b_layernorm(B), mixer.c_layernorm(C)
    dt = F.softplus(dt @ mixer.dt_proj.weight.T + mixer.dt_proj.bias)
    return dict(x=x, B=B, C=C, dt=dt, A=-torch.exp(mixer.A_log.float()), z=z)


def mamba1_hidden_attention(C, B, dt, A, channels=None, chunk: int = 64) -> torch.Tensor:
    """alpha [batch, channels, T, T] of Mamba-1 channels (each channel is its own SSM):

        alpha[t, s] = sum_n C_t[n] exp(A[n] * sum_{k=s+1..t} dt_k) dt_s B_s[n],

    computed `chunk` channels at a time ([batch, chunk, state, T, T] at most in memory)."""
    C, B, dt = wide(C), wide(B), wide(dt)
    channels = torch.arange(dt.shape[-1]) if channels is None else torch.as_tensor(channels)
    parts = []
    for i in range(0, len(channels), chunk):
        ch = channels[i : i + chunk]
        d = dt[..., ch].transpose(1, 2)  # [b, c, T]
        seg = segment_sum(d)[:, :, None]  # [b, c, 1, T, T], -inf above the diagonal
        # Multiply A into the finite sums only: A * -inf would be +inf for A < 0.
        rate = torch.where(
            seg.isfinite(), A[ch][None, :, :, None, None] * seg.clamp(min=0), float("-inf")
        )
        decay = torch.exp(rate)  # [b, c, n, T, T]
        parts.append(torch.einsum("btn,bcnts,bsn->bcts", C, decay, B) * d[:, :, None, :])
    return torch.cat(parts, dim=1)


def discrete_hidden_attention(
    log_decay: torch.Tensor, B: torch.Tensor, C: torch.Tensor
) -> torch.Tensor:
    """alpha [b, h, T, T] with y = alpha @ x: (C_t . B_s) times the decays of steps s+1..t."""
    return torch.einsum("bthn,bshn->bhts", wide(C), wide(B)) * torch.exp(
        segment_sum(log_decay.transpose(1, 2))
    )
