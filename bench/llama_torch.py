"""A plain-PyTorch Llama, Qwen2 and Qwen3: the reference for the engine's logits and training
tests and its benchmark peer.

Written from the Hugging Face LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM
definitions (no transformers package): RMSNorm in F32, rotate-half RoPE with inv_freq in F32
(default, or YaRN as transformers' _compute_yarn_parameters, cos and sin times its attention
factor), grouped-query attention, SwiGLU, tied or untied lm_head; Qwen2's biases on q, k and v;
Qwen3's RMSNorm over each head's q and k before RoPE. Attention keeps the key/value heads
unrepeated (queries of one KV group are folded into the row dimension), the cheapest exact form
on a CPU. Checkpoints are read in F32, F16 or BF16, in one file or in shards with an index.

  llama_torch.py logits --checkpoint DIR --tokens 1,2,3 [--start P]
                                                            -> {"logits": [[...], ...]} (positions P, P+1, ...)
  llama_torch.py sft --checkpoint DIR --tokens 1,2,3        -> {"logits", "logprobs": [log p(tokens[i] | tokens[:i]), i >= 1],
                                                                "grads": {HF tensor name: flat gradient of -sum(logprobs)}}
  llama_torch.py train --checkpoint DIR --tokens 1,2,3 --steps N [--lr --weight-decay --max-grad-norm]
                                                            -> {"losses": [-sum(logprobs) before each step],
                                                                "weights": {HF tensor name: flat values after N AdamW steps}}
  llama_torch.py rope --configs JSON_LIST                   -> [{"inv_freq": [...], "attention_scaling": a}, ...]
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


STORED = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def load_safetensors(path):
    """A dict of F32 tensors from a safetensors file (F32, F16 or BF16: 16-bit values widen exactly)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + begin : base + end]), dtype=STORED[info["dtype"]])
        out[name] = t.float().reshape(info["shape"]).clone()
    return out


def load_checkpoint(directory):
    """Every tensor of a checkpoint directory: model.safetensors, or the shards its index lists."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if not os.path.exists(index):
        return load_safetensors(os.path.join(directory, "model.safetensors"))
    out = {}
    for shard in sorted(set(json.load(open(index))["weight_map"].values())):
        out.update(load_safetensors(os.path.join(directory, shard)))
    return out


def rope_scaling(cfg):
    """The config's RoPE scaling dict (rope_parameters of transformers 5, or rope_scaling), or {}."""
    r = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    return {k: v for k, v in r.items() if v is not None}


def rope_parameters(cfg, hd):
    """(inv_freq [hd / 2] in F32, attention factor) as transformers computes them: the default
    frequencies, or YaRN's blend of interpolated and extrapolated ones (_compute_yarn_parameters)."""
    r = rope_scaling(cfg)
    base = r.get("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = r.get("rope_type", r.get("type", "default"))
    pos_freqs = base ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd)
    if kind == "default":
        return 1.0 / pos_freqs, 1.0
    assert kind == "yarn", kind
    factor = r["factor"]
    original = r.get("original_max_position_embeddings") or cfg["max_position_embeddings"]

    def get_mscale(scale, mscale=1):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = r.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = r.get("mscale"), r.get("mscale_all_dim")
        attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) if mscale and mscale_all_dim else get_mscale(factor)

    def correction_dim(rotations):
        return (hd * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(r.get("beta_fast") or 32), correction_dim(r.get("beta_slow") or 1)
    if r.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, hd - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(hd // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = 1.0 / (factor * pos_freqs) * (1 - extrapolation) + 1.0 / pos_freqs * extrapolation
    return inv_freq, float(attention_factor)


class Llama(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        D, F_, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
        self.H, self.KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim") or D // self.H  # LlamaConfig: H * hd need not be D
        self.eps = cfg["rms_norm_eps"]
        self.qkv_bias = cfg.get("model_type") == "qwen2"  # Qwen2Attention: bias on q, k, v (not o)
        self.qk_norm = cfg.get("model_type") == "qwen3"  # Qwen3Attention: q_norm, k_norm over head_dim
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
            if self.qkv_bias:
                layer.bq, layer.bk, layer.bv = P(torch.zeros(self.H * self.hd)), P(torch.zeros(self.KV * self.hd)), P(torch.zeros(self.KV * self.hd))
            if self.qk_norm:
                layer.q_norm, layer.k_norm = P(torch.ones(self.hd)), P(torch.ones(self.hd))
            self.layers.append(layer)
        self.norm = P(torch.ones(D))
        self.lm_head = None if cfg.get("tie_word_embeddings", False) else P(torch.randn(V, D) * 0.02)
        self.inv_freq, self.attention_scaling = rope_parameters(cfg, self.hd)

    def load_hf(self, tensors):
        with torch.no_grad():
            for name, p in named_parameters(self):
                p.copy_(tensors[name])

    def rms(self, x, w):
        variance = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(variance + self.eps))

    def rope(self, x, positions):
        # x [B, heads, T, hd]; positions [T] (the same for every row of the batch)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling
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
            q, k, v = h @ layer.q.t(), h @ layer.k.t(), h @ layer.v.t()
            if self.qkv_bias:
                q, k, v = q + layer.bq, k + layer.bk, v + layer.bv
            q, k, v = q.view(B, T, self.H, self.hd), k.view(B, T, self.KV, self.hd), v.view(B, T, self.KV, self.hd)
            if self.qk_norm:
                q, k = self.rms(q, layer.q_norm), self.rms(k, layer.k_norm)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
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
    model.load_hf(load_checkpoint(args.checkpoint))
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
    "bq": "self_attn.q_proj.bias",
    "bk": "self_attn.k_proj.bias",
    "bv": "self_attn.v_proj.bias",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
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
            if hasattr(layer, attr):
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


def cmd_train(args):
    """AdamW steps (torch.optim.AdamW after clip_grad_norm_) on the SFT loss -sum(logprobs)."""
    model, ids = load_model(args)
    params = [p for _, p in named_parameters(model)]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=args.weight_decay)
    losses = []
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        logits = model(ids)[0]
        loss = -F.log_softmax(logits, dim=-1)[torch.arange(ids.shape[1] - 1), ids[0, 1:]].sum()
        loss.backward()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        opt.step()
        losses.append(loss.item())
    weights = {name: p.detach().reshape(-1).tolist() for name, p in named_parameters(model)}
    print(json.dumps({"losses": losses, "weights": weights}))


def cmd_rope(args):
    """The RoPE parameters of each config of a JSON list."""
    out = []
    for cfg in json.loads(args.configs):
        inv_freq, attention_scaling = rope_parameters(cfg, cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
        out.append({"inv_freq": inv_freq.tolist(), "attention_scaling": attention_scaling})
    print(json.dumps(out))


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
    tr = sub.add_parser("train")
    tr.add_argument("--checkpoint", required=True)
    tr.add_argument("--tokens", required=True)
    tr.add_argument("--steps", type=int, default=3)
    tr.add_argument("--lr", type=float, default=1e-3)
    tr.add_argument("--weight-decay", type=float, default=0.01)
    tr.add_argument("--max-grad-norm", type=float, default=1.0)
    rp = sub.add_parser("rope")
    rp.add_argument("--configs", required=True)
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
    commands = {"logits": cmd_logits, "sft": cmd_sft, "train": cmd_train, "rope": cmd_rope, "bench": cmd_bench, "sgemm": cmd_sgemm, "stream": cmd_stream}
    commands[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
