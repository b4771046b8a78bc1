"""The PyTorch peer of the engine's parity tests: bench/llama_torch.py's plain-PyTorch Llama
(written from the Hugging Face definition) on a checkpoint directory, with autograd.

  torch_peer.py sft --checkpoint DIR --tokens 1,2,3
    -> {"logits": [[...] per position], "logprobs": [log p(tokens[i] | tokens[:i]) for i >= 1],
        "grads": {HF tensor name: flat gradient of -sum(logprobs)}}

Run with /usr/bin/python3 (Debian's python3-torch).
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from llama_torch import Llama, load_safetensors  # noqa: E402

LAYER_NAMES = {
    "ln_in": "input_layernorm.weight",
    "q": "self_attn.q_proj.weight",
    "k": "self_attn.k_proj.weight",
    "v": "self_attn.v_proj.weight",
    "o": "self_attn.o_proj.weight",
    "ln_post": "post_attention_layernorm.weight",
    "gate": "mlp.gate_proj.weight",
    "up": "mlp.up_proj.weight",
    "down": "mlp.down_proj.weight",
}


def named_parameters(model):
    """(HF name, parameter) for every tensor of the model."""
    yield "model.embed_tokens.weight", model.embed
    for i, layer in enumerate(model.layers):
        for attr, name in LAYER_NAMES.items():
            yield f"model.layers.{i}.{name}", getattr(layer, attr)
    yield "model.norm.weight", model.norm
    if model.lm_head is not None:
        yield "lm_head.weight", model.lm_head


def cmd_sft(args):
    cfg = json.load(open(os.path.join(args.checkpoint, "config.json")))
    model = Llama(cfg)
    model.load_hf(load_safetensors(os.path.join(args.checkpoint, "model.safetensors")))
    ids = torch.tensor([[int(t) for t in args.tokens.split(",")]])
    logits = model(ids)[0]
    logp = F.log_softmax(logits, dim=-1)
    picked = logp[torch.arange(ids.shape[1] - 1), ids[0, 1:]]
    (-picked.sum()).backward()
    grads = {name: p.grad.reshape(-1).tolist() for name, p in named_parameters(model)}
    print(json.dumps({"logits": logits.tolist(), "logprobs": picked.tolist(), "grads": grads}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sft = sub.add_parser("sft")
    sft.add_argument("--checkpoint", required=True)
    sft.add_argument("--tokens", required=True)
    args = p.parse_args()
    {"sft": cmd_sft}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
