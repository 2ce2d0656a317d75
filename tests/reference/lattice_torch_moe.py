"""The PyTorch twin of Lattice's mixture-of-experts MLP (src/lattice/model/moe_mlp.hpp), for
lattice_torch's Llama blocks in MoE layers.

Written from the definitions, token by token per expert (not Lattice's dispatch): an fp32 router
(autocast off, as Lattice keeps it fp32), softmax or sigmoid scores, top-k by score (ties to the lower
index), the chosen scores renormalised when asked and scaled; with a capacity factor each expert keeps
its first ceil(factor * T * k / E) copies in (token, k) order and a dropped copy adds nothing. Experts
are SwiGLU MLPs with Mixtral's (w1, w3, w2) or DeepSeek's (gate_proj, up_proj, down_proj) names, or
GELU MLPs (moe_activation "gelu": w1, w2 or up_proj, down_proj);
shared experts are one dense SwiGLU beside them. The balancing losses are those of moe_mlp.hpp:
aux = alpha * E * sum_e f_e * P_e with f_e = counts_e / (T k) a constant (detached), P_e the mean score,
and z = beta * mean_t lse_t^2. `forward` returns the output and keeps the layer's balancing loss in
`self.balancing_loss`.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Expert(nn.Module):
    """SwiGLU (gate, up, down) or, with gelu, in -> GELU (tanh form) -> out (Mixtral names w1, w2;
    DeepSeek's up_proj, down_proj)."""

    def __init__(self, d_model, width, names, make_linear, gelu=False):
        super().__init__()
        self.gelu = gelu
        if gelu:
            self.names = ("w1", "w2") if names == "mixtral" else ("up_proj", "down_proj")
        else:
            self.names = ("w1", "w3", "w2") if names == "mixtral" else ("gate_proj", "up_proj", "down_proj")
        for n in self.names[:-1]:
            setattr(self, n, make_linear(d_model, width))
        setattr(self, self.names[-1], make_linear(width, d_model))

    def forward(self, x):
        if self.gelu:
            up, down = (getattr(self, n) for n in self.names)
            return down(F.gelu(up(x), approximate="tanh"))
        gate, up, down = (getattr(self, n) for n in self.names)
        return down(F.silu(gate(x)) * up(x))


class MoeMlp(nn.Module):
    """Parameters: gate.weight [E, C], experts.<j>.*, and with shared experts shared_experts.*
    (gate_proj / up_proj / down_proj of width moe_shared_experts * expert width)."""

    def __init__(self, config, make_linear):
        super().__init__()
        C = config["d_model"]
        self.experts_count = config["n_experts"]
        self.top_k = config["top_k"]
        self.score = config.get("moe_score", "softmax")
        self.normalize = bool(config.get("moe_normalize", True))
        self.scaling = float(config.get("moe_scaling", 1.0))
        self.capacity_factor = config.get("moe_capacity_factor")
        self.aux_coef = float(config.get("moe_aux_loss_coef", 0.0))
        self.z_coef = float(config.get("moe_z_loss_coef", 0.0))
        width = config.get("moe_ffn_hidden", 0) or config["ffn_hidden"]
        names = config.get("moe_names", "mixtral")
        self.gate = nn.Linear(C, self.experts_count, bias=False)
        gelu = config.get("moe_activation", "swiglu") == "gelu"
        self.experts = nn.ModuleList(
            Expert(C, width, names, make_linear, gelu) for _ in range(self.experts_count)
        )
        shared = config.get("moe_shared_experts", 0)
        self.shared_experts = Expert(C, shared * width, "deepseek", make_linear) if shared else None
        self.balancing_loss = None

    def forward(self, x):
        shape = x.shape
        xt = x.reshape(-1, shape[-1])
        T, E, K = xt.shape[0], self.experts_count, self.top_k
        with torch.autocast("cpu", enabled=False):
            logits = F.linear(xt.float(), self.gate.weight.float())
        scores = torch.softmax(logits, dim=-1) if self.score == "softmax" else torch.sigmoid(logits)
        # The top k by score, ties to the lower index: a stable descending sort.
        chosen = torch.sort(scores.detach(), dim=-1, descending=True, stable=True).indices[:, :K]
        weights = scores.gather(1, chosen)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights * self.scaling
        keep = torch.ones_like(chosen, dtype=torch.bool)
        if self.capacity_factor:
            capacity = math.ceil(self.capacity_factor * T * K / E)
            flat = chosen.reshape(-1)  # copies in (token, k) order
            seen = torch.zeros(E, dtype=torch.long)
            kept = torch.ones_like(flat, dtype=torch.bool)
            for c in range(flat.numel()):
                e = int(flat[c])
                kept[c] = bool(seen[e] < capacity)
                seen[e] += 1
            keep = kept.reshape(chosen.shape)
        out = torch.zeros_like(xt, dtype=torch.float32)
        for e in range(E):
            tokens, slots = torch.nonzero((chosen == e) & keep, as_tuple=True)
            if tokens.numel() == 0:
                continue
            y = self.experts[e](xt[tokens]).float()
            out = out.index_add(0, tokens, y * weights[tokens, slots].unsqueeze(1))
        if self.shared_experts is not None:
            out = out + self.shared_experts(xt).float()
        counts = torch.bincount(chosen.reshape(-1), minlength=E).double()
        loss = torch.zeros((), dtype=torch.float32)
        if self.aux_coef:
            f = (counts / (T * K)).float()
            loss = loss + self.aux_coef * E * (f * scores.mean(dim=0)).sum()
        if self.z_coef:
            loss = loss + self.z_coef * (torch.logsumexp(logits, dim=-1) ** 2).mean()
        self.balancing_loss = loss
        return out.reshape(shape)
