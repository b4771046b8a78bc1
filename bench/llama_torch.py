"""A plain-PyTorch Llama: the reference for the engine's logits test and its benchmark peer.

Written from the Hugging Face LlamaForCausalLM definition (no transformers package):
RMSNorm in F32, rotate-half RoPE with inv_freq in F32, grouped-query attention, SwiGLU,
tied or untied lm_head. Attention keeps the key/value heads unrepeated (queries of one KV
group are folded into the row dimension), the cheapest exact form on a CPU.

  llama_torch.py logits --checkpoint DIR --tokens 1,2,3 [--start P]
                                                            -> {"logits": [[...], ...]} (positions P, P+1, ...)
  llama_torch.py sft --checkpoint DIR --tokens 1,2,3        -> {"logits", "logprobs": [log p(tokens[i] | tokens[:i]), i >= 1],
                                                                "grads": {HF tensor name: flat gradient of -sum(logprobs)}}
  llama_torch.py bench --config JSON --threads N [...]      -> timings as one JSON line
  llama_torch.py sgemm --threads N                          -> {"sgemm_gflops": g}
  llama_torch.py stream --threads N                         -> {"triad_gb_s": t, "read_gb_s": r}

Run with /usr/bin/python3 (Debian's python3-torch; with libopenblas0-pthread installed torch
uses OpenBLAS).
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F


def load_safetensors(path):
    """A dict of F32 tensors from a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", name
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + begin : base + end]), dtype=torch.float32)
        out[name] = t.reshape(info["shape"]).clone()
    return out


class Llama(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        D, F_, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
        self.H, self.KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or D // self.H  # LlamaConfig: H * hd need not be D
        self.eps = cfg["rms_norm_eps"]
        P = torch.nn.Parameter
        self.embed = P(torch.randn(V, D) * 0.02)
        self.layers = torch.nn.ModuleList()
        for _ in range(cfg["num_hidden_layers"]):
            layer = torch.nn.Module()
            layer.ln_in = P(torch.ones(D))
            layer.q = P(torch.randn(self.H * self.hd, D) * 0.02)
            layer.k = P(torch.randn(self.KV * self.hd, D) * 0.02)
            layer.v = P(torch.randn(self.KV * self.hd, D) * 0.02)
            layer.o = P(torch.randn(D, self.H * self.hd) * 0.02)
            layer.ln_post = P(torch.ones(D))
            layer.gate = P(torch.randn(F_, D) * 0.02)
            layer.up = P(torch.randn(F_, D) * 0.02)
            layer.down = P(torch.randn(D, F_) * 0.02)
            self.layers.append(layer)
        self.norm = P(torch.ones(D))
        self.lm_head = None if cfg.get("tie_word_embeddings", False) else P(torch.randn(V, D) * 0.02)
        self.inv_freq = 1.0 / (cfg.get("rope_theta", 10000.0) ** (torch.arange(0, self.hd, 2, dtype=torch.int64).float() / self.hd))

    def load_hf(self, tensors):
        with torch.no_grad():
            self.embed.copy_(tensors["model.embed_tokens.weight"])
            for i, layer in enumerate(self.layers):
                p = f"model.layers.{i}."
                layer.ln_in.copy_(tensors[p + "input_layernorm.weight"])
                layer.q.copy_(tensors[p + "self_attn.q_proj.weight"])
                layer.k.copy_(tensors[p + "self_attn.k_proj.weight"])
                layer.v.copy_(tensors[p + "self_attn.v_proj.weight"])
                layer.o.copy_(tensors[p + "self_attn.o_proj.weight"])
                layer.ln_post.copy_(tensors[p + "post_attention_layernorm.weight"])
                layer.gate.copy_(tensors[p + "mlp.gate_proj.weight"])
                layer.up.copy_(tensors[p + "mlp.up_proj.weight"])
                layer.down.copy_(tensors[p + "mlp.down_proj.weight"])
            self.norm.copy_(tensors["model.norm.weight"])
            if self.lm_head is not None:
                self.lm_head.copy_(tensors["lm_head.weight"])

    def rms(self, x, w):
        variance = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(variance + self.eps))

    def rope(self, x, positions):
        # x [B, heads, T, hd]; positions [T] (the same for every row of the batch)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        half = self.hd // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def forward(self, ids, start=0, cache=None):
        """Logits for ids [B, T] at positions start..start+T-1; cache: per layer (K, V) tensors
        [B, KV, Tmax, hd] filled in place (None: no cache, plain causal attention)."""
        B, T = ids.shape
        G = self.H // self.KV
        positions = torch.arange(start, start + T)
        ctx = start + T
        keys, first = (ctx, start) if cache is not None else (T, 0)  # without a cache: these T tokens only
        mask = None
        if T > 1:
            causal = torch.full((T, keys), float("-inf")).triu(first + 1)
            mask = causal.repeat(G, 1)  # rows: (group member, query)
        x = self.embed[ids]
        for i, layer in enumerate(self.layers):
            h = self.rms(x, layer.ln_in)
            q = (h @ layer.q.t()).view(B, T, self.H, self.hd).transpose(1, 2)
            k = (h @ layer.k.t()).view(B, T, self.KV, self.hd).transpose(1, 2)
            v = (h @ layer.v.t()).view(B, T, self.KV, self.hd).transpose(1, 2)
            q, k = self.rope(q, positions), self.rope(k, positions)
            if cache is not None:
                kc, vc = cache[i]
                kc[:, :, start:ctx] = k
                vc[:, :, start:ctx] = v
                k, v = kc[:, :, :ctx], vc[:, :, :ctx]
            qg = q.reshape(B, self.KV, G * T, self.hd)
            s = (qg @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.hd))
            if mask is not None:
                s = s + mask
            a = (F.softmax(s, dim=-1) @ v).view(B, self.H, T, self.hd).transpose(1, 2).reshape(B, T, self.H * self.hd)
            x = x + a @ layer.o.t()
            h = self.rms(x, layer.ln_post)
            x = x + (F.silu(h @ layer.gate.t()) * (h @ layer.up.t())) @ layer.down.t()
        x = self.rms(x, self.norm)
        return x @ (self.embed if self.lm_head is None else self.lm_head).t()


def load_model(args):
    """The checkpoint's model and the --tokens ids [1, T]."""
    model = Llama(json.load(open(os.path.join(args.checkpoint, "config.json"))))
    model.load_hf(load_safetensors(os.path.join(args.checkpoint, "model.safetensors")))
    return model, torch.tensor([[int(t) for t in args.tokens.split(",")]])


def cmd_logits(args):
    model, ids = load_model(args)
    with torch.no_grad():
        logits = model(ids, start=args.start)[0]
    print(json.dumps({"logits": logits.tolist()}))


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
    model, ids = load_model(args)
    logits = model(ids)[0]
    picked = F.log_softmax(logits, dim=-1)[torch.arange(ids.shape[1] - 1), ids[0, 1:]]
    (-picked.sum()).backward()
    grads = {name: p.grad.reshape(-1).tolist() for name, p in named_parameters(model)}
    print(json.dumps({"logits": logits.tolist(), "logprobs": picked.tolist(), "grads": grads}))


def timed(fn, min_time):
    """Best seconds per call of fn over repeats lasting at least min_time."""
    fn()
    best, spent = float("inf"), 0.0
    while spent < min_time:
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        best, spent = min(best, dt), spent + dt
    return best


def cmd_bench(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = json.loads(args.config)
    model = Llama(cfg)
    B, KV, hd, L = args.batch, model.KV, model.hd, cfg["num_hidden_layers"]
    V = cfg["vocab_size"]
    out = {"threads": torch.get_num_threads(), "torch": torch.__version__}

    def new_cache(rows, length):
        return [(torch.zeros(rows, KV, length, hd), torch.zeros(rows, KV, length, hd)) for _ in range(L)]

    with torch.no_grad():
        for ctx in args.contexts:
            steps = args.decode_steps
            if ctx <= args.batch_prefill_max:
                # batched prefill of B sequences of ctx tokens
                ids = torch.randint(0, V, (B, ctx))
                cache = new_cache(B, ctx + steps)
                prefill = timed(lambda: model(ids, 0, cache), args.min_time)
                out[f"prefill_{ctx}_s"] = prefill
                out[f"prefill_{ctx}_tokens"] = B * ctx
            else:
                # one sequence prefilled, its KV copied into B rows
                ids = torch.randint(0, V, (1, ctx))
                one = new_cache(1, ctx)
                prefill = timed(lambda: model(ids, 0, one), args.min_time)
                out[f"prefill_{ctx}_s"] = prefill
                out[f"prefill_{ctx}_tokens"] = ctx
                cache = new_cache(B, ctx + steps)
                for (kc, vc), (k1, v1) in zip(cache, one):
                    kc[:, :, :ctx] = k1
                    vc[:, :, :ctx] = v1
            step_ids = torch.randint(0, V, (B, 1))

            def decode():
                for s in range(steps):
                    model(step_ids, ctx + s, cache)

            out[f"decode_{ctx}_s"] = timed(decode, args.min_time)
            out[f"decode_{ctx}_tokens"] = B * steps

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    ids = torch.randint(0, V, (args.train_batch, args.train_seq + 1))

    def train_step():
        opt.zero_grad(set_to_none=True)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    out["train_s"] = timed(train_step, args.min_time)
    out["train_tokens"] = args.train_batch * args.train_seq
    print(json.dumps(out))


def cmd_sgemm(args):
    torch.set_num_threads(args.threads)
    n = args.n
    a, b = torch.randn(n, n), torch.randn(n, n)
    seconds = timed(lambda: a @ b, args.min_time)
    print(json.dumps({"sgemm_gflops": 2 * n**3 / seconds / 1e9, "n": n, "threads": torch.get_num_threads()}))


def cmd_stream(args):
    """Memory bandwidth on arrays far larger than the caches: STREAM's triad a = b + s c
    (3 x 4 bytes per element moved) and a read-only sum (4 bytes per element)."""
    torch.set_num_threads(args.threads)
    n = args.mib * 2**20 // 4
    a, b, c = torch.zeros(n), torch.ones(n), torch.ones(n)
    triad = timed(lambda: torch.add(b, c, alpha=3.0, out=a), args.min_time)
    read = timed(lambda: torch.sum(b), args.min_time)
    print(json.dumps({"triad_gb_s": 12 * n / triad / 1e9, "read_gb_s": 4 * n / read / 1e9, "mib": args.mib, "threads": torch.get_num_threads()}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    lg = sub.add_parser("logits")
    lg.add_argument("--checkpoint", required=True)
    lg.add_argument("--tokens", required=True)
    lg.add_argument("--start", type=int, default=0, help="position of the first token")
    sf = sub.add_parser("sft")
    sf.add_argument("--checkpoint", required=True)
    sf.add_argument("--tokens", required=True)
    bn = sub.add_parser("bench")
    bn.add_argument("--config", required=True)
    bn.add_argument("--threads", type=int, required=True)
    bn.add_argument("--batch", type=int, default=16)
    bn.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[512, 4096])
    bn.add_argument("--batch-prefill-max", type=int, default=512)
    bn.add_argument("--decode-steps", type=int, default=8)
    bn.add_argument("--train-batch", type=int, default=4)
    bn.add_argument("--train-seq", type=int, default=256)
    bn.add_argument("--min-time", type=float, default=1.0)
    sg = sub.add_parser("sgemm")
    sg.add_argument("--threads", type=int, required=True)
    sg.add_argument("--n", type=int, default=1024)
    sg.add_argument("--min-time", type=float, default=1.0)
    st = sub.add_parser("stream")
    st.add_argument("--threads", type=int, required=True)
    st.add_argument("--mib", type=int, default=256)
    st.add_argument("--min-time", type=float, default=1.0)
    args = p.parse_args()
    {"logits": cmd_logits, "sft": cmd_sft, "bench": cmd_bench, "sgemm": cmd_sgemm, "stream": cmd_stream}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
