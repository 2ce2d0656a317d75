#!/usr/bin/python3
"""Writes the PyTorch reference a Lattice parity test compares against.

Input: Lattice's initial weights (a safetensors file of every parameter, Lattice names and [out, in]
Linear weights, with the model config as the "lattice.model" JSON metadata, or given by --config) and a
batch (a safetensors file with I32 "tokens" and "targets", both [B, T]; negative targets are ignored).

Output (one safetensors file, all F32), for three runs: fp32 (no prefix), bf16 autocast
(torch.autocast("cpu", dtype=torch.bfloat16), prefix "bf16/") and an fp32 emulation of Lattice's own
bf16 rounding (lattice_torch.LATTICE_BF16_OPS, prefix "lattice_bf16/"):
  logits            [B*T, V]  logits of the initial weights
  loss              []        mean cross-entropy
  grad/<parameter>            gradient of the loss
  losses            [steps]   loss before each of `steps` AdamW steps on the same batch
  grad_norms        [steps]   pre-clip global gradient norm of each step
Metadata: "lattice.model" (the config), "lattice.reference" (the training hyper-parameters the C++ test
must use: constant lr, betas, eps, weight decay on rank >= 2 parameters, clipping max norm, steps) and
the torch version.

Usage: /usr/bin/python3 make_reference.py --weights INIT --batch BATCH --out REFERENCE [--config JSON]
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lattice_torch as lt  # noqa: E402

# The training run the references record (the C++ test reads these from the output's metadata).
HYPER = {
    "lr": 1e-3,  # constant schedule: the same lr for every step
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-8,
    "weight_decay": 0.1,  # only parameters of rank >= 2 (matrices, embeddings)
    "max_grad_norm": 1.0,  # torch.nn.utils.clip_grad_norm_
    "steps": 10,
}


# The runs: output prefix, products, whether under bf16 autocast.
RUNS = [
    ("", lt.TORCH_OPS, False),
    ("bf16/", lt.TORCH_OPS, True),
    ("lattice_bf16/", lt.LATTICE_BF16_OPS, False),
]


def training_loss(model, loss):
    """The loss the gradients are of: the cross-entropy plus a MoE model's balancing losses (the
    recorded "loss" and "losses" are the cross-entropy alone, as Lattice reports it)."""
    balancing = getattr(model, "balancing_loss", None)
    return loss if balancing is None else loss + balancing


def run(config, weights, tokens, targets, prefix, ops, bf16_autocast):
    """Forward/backward and `steps` AdamW steps from the given weights; returns {name: tensor}."""
    torch.manual_seed(0)
    model = lt.load_lattice_weights(lt.build_model(config, ops), weights)
    model.train()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16_autocast)
    out = {}

    with autocast:
        logits, loss = model(tokens, targets)
    training_loss(model, loss).backward()
    out[prefix + "logits"] = logits.detach().float().reshape(-1, logits.shape[-1])
    out[prefix + "loss"] = loss.detach().float().reshape(())
    for name, p in model.named_parameters():
        # An expert no token was routed to has no gradient in PyTorch; Lattice's is zero.
        grad = p.grad if p.grad is not None else torch.zeros_like(p)
        out[prefix + "grad/" + name] = grad.detach().float().clone()

    model = lt.load_lattice_weights(lt.build_model(config, ops), weights)
    optimizer = lt.make_adamw(
        model,
        lr=HYPER["lr"],
        betas=(HYPER["beta1"], HYPER["beta2"]),
        eps=HYPER["eps"],
        weight_decay=HYPER["weight_decay"],
    )
    losses, norms = [], []
    for _ in range(HYPER["steps"]):
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            _, loss = model(tokens, targets)
        training_loss(model, loss).backward()
        # An expert no token reached: a zero gradient, as in Lattice, so that AdamW still decays
        # its weights and moves its moments (PyTorch skips a parameter whose grad is None).
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        norms.append(lt.clip_gradients(model, HYPER["max_grad_norm"]))
        optimizer.step()
        losses.append(float(loss))
    out[prefix + "losses"] = torch.tensor(losses, dtype=torch.float32)
    out[prefix + "grad_norms"] = torch.tensor(norms, dtype=torch.float32)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", required=True, help="initial weights (safetensors)")
    parser.add_argument("--batch", required=True, help="tokens and targets (safetensors, I32 [B, T])")
    parser.add_argument("--out", required=True, help="reference output (safetensors)")
    parser.add_argument("--config", help="model config JSON file (default: the weights' metadata)")
    args = parser.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # one thread: the same reduction order on every machine

    weights, metadata = lt.read_safetensors(args.weights)
    if args.config:
        with open(args.config) as f:
            config = json.load(f)
    elif "lattice.model" in metadata:
        config = json.loads(metadata["lattice.model"])
    else:
        sys.exit(f"{args.weights} has no 'lattice.model' metadata: pass --config")
    batch, _ = lt.read_safetensors(args.batch)
    tokens, targets = batch["tokens"].long(), batch["targets"].long()

    out = {}
    for prefix, ops, bf16_autocast in RUNS:
        out.update(run(config, weights, tokens, targets, prefix, ops, bf16_autocast))
    lt.write_safetensors(
        args.out,
        out,
        {
            "lattice.model": json.dumps(config, sort_keys=True),
            "lattice.reference": json.dumps(HYPER, sort_keys=True),
            "torch": torch.__version__,
        },
    )
    for prefix, _, _ in RUNS:
        print(
            f"{args.out}: {prefix or 'fp32/'} loss {float(out[prefix + 'loss']):.6f} -> "
            f"{float(out[prefix + 'losses'][-1]):.6f}"
        )


if __name__ == "__main__":
    main()
