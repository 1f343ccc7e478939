"""Token generation: milliseconds per new token of Hugging Face greedy `generate` on a
Llama-architecture model built from its config (random weights, no download), next to the
memory-bandwidth floor, in one process, backends interleaved.

    python benchmarks/decode.py [--tokens 32] [--runs 5]

Backends: eager (Hugging Face's default dynamic cache); Blade through
`torch.compile(model.forward, backend="blade")` with the dynamic cache and with the static
cache (`generation_config.cache_implementation = "static"`, what Hugging Face recommends
for compiled generation, compiled with dynamic=False as Hugging Face compiles it); Inductor
(`torch.compile` with its default backend) with the static cache. ms per token is the
time of `generate` with `--tokens` new tokens less the time with one (the prefill and the
first token), over the tokens between; the median of `--runs` interleaved rounds. Every
backend's tokens are checked against eager's.

The floor: a decode step reads every weight once (the embedding table excepted: one row),
so it cannot take less than those bytes over the machine's read bandwidth, measured here
(`peak.ReadBandwidth`: vector loads of a buffer as large as the weights, read round after
round as decode reads them) on the benchmarks' 2 threads. The KV cache and the
activations are left out of the bytes: the floor is a lower bound. A shared host's
bandwidth changes from minute to minute, so the floor is measured again just before each
backend's timing in each round, and /floor is the median of those side-by-side ratios.
"""
import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from child import TORCHSCRIPT_DEPRECATION  # noqa: E402
from peak import THREADS, ReadBandwidth  # noqa: E402

from blade import _C  # noqa: E402

warnings.filterwarnings("ignore", message=TORCHSCRIPT_DEPRECATION)

# A ~0.7 GB (float32) decoder: its weights are far larger than any cache, as a served
# model's are, so a decode step is bound by memory as it would be.
CONFIG = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
              num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
              max_position_embeddings=1024, tie_word_embeddings=False)
PROMPT = 32
# Calls of an engine by which its kernel trials have decided (kernel_trials.cpp).
TRIAL_CALLS = _C.kernel_trial_calls()


def build():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).eval()
    prompt = torch.randint(0, CONFIG["vocab_size"], (1, PROMPT))
    return model, prompt


def weight_bytes_per_token(model) -> int:
    """What one decode step reads: every parameter, the embedding table but one row."""
    embedding = model.get_input_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return total - embedding.numel() * embedding.element_size() + \
        embedding.shape[1] * embedding.element_size()


class Backend:
    def __init__(self, name, model, prompt, cache, compile_with):
        self.name, self.model, self.prompt = name, model, prompt
        if cache == "static":
            model.generation_config.cache_implementation = "static"
        if compile_with is not None:
            # With the static cache every shape is fixed, and Hugging Face compiles it with
            # dynamic=False. Without it, Dynamo would trace this model with the dims that
            # varied for another instance of the same forward (automatic dynamic shapes
            # are kept per code object), here the dynamic cache's length.
            model.forward = torch.compile(model.forward, backend=compile_with,
                                          dynamic=False if cache == "static" else None)
        self.times = {}

    def generate(self, tokens):
        with torch.no_grad():
            return self.model.generate(self.prompt, max_new_tokens=tokens, do_sample=False,
                                       min_new_tokens=tokens, pad_token_id=0)

    def timed(self, tokens):
        """The tokens, and the seconds they took."""
        start = time.perf_counter()
        out = self.generate(tokens)
        seconds = time.perf_counter() - start
        self.times.setdefault(tokens, []).append(seconds)
        return out, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backends", default="eager,blade,blade_static,inductor_static")
    args = parser.parse_args()
    torch.set_num_threads(THREADS)
    import blade  # noqa: F401  (registers backend="blade")

    # Every backend compiles the same code object (LlamaForCausalLM.forward), each model
    # with its own guards and each shape of prompt and cache with its own: Dynamo's
    # default of 8 entries per code object would leave the backends compiled last
    # running eager's code.
    torch._dynamo.config.recompile_limit = 64

    kinds = {"eager": ("dynamic", None), "blade": ("dynamic", "blade"),
             "blade_static": ("static", "blade"), "inductor_static": ("static", "inductor")}
    names = args.backends.split(",")
    unknown = [n for n in names if n not in kinds]
    if unknown:
        raise SystemExit(f"unknown backends {unknown}; known: {', '.join(kinds)}")
    backends, reference = [], None
    for name in names:
        model, prompt = build()   # each its own copy: compile replaces model.forward
        backend = Backend(name, model, prompt, *kinds[name])
        start = time.perf_counter()
        tokens = backend.generate(args.tokens)   # compiles, and warms up
        backend.setup_seconds = time.perf_counter() - start
        for _ in range(TRIAL_CALLS):   # the prompt's engine too, past its kernel trials
            backend.generate(1)
        reference = tokens if reference is None else reference
        backend.same = torch.equal(tokens, reference)
        backends.append(backend)
    bytes_per_token = weight_bytes_per_token(backends[0].model)
    # A buffer as large as the weights, read again and again as decode reads them: on a CPU
    # whose last-level cache holds a share of them, that share is read from the cache in
    # both.
    bandwidth = ReadBandwidth(THREADS, bytes_per_token)
    rates, ratios = [], {backend.name: [] for backend in backends}
    for _ in range(args.runs):
        for backend in backends:
            rates.append(bandwidth.measure())
            floor = bytes_per_token / (rates[-1] * 1e9) * 1e3
            short = backend.timed(1)[1]
            tokens, long = backend.timed(args.tokens)
            backend.same &= torch.equal(tokens, reference)
            ratios[backend.name].append((long - short) / (args.tokens - 1) * 1e3 / floor)
    rate = statistics.median(rates)
    floor_ms = bytes_per_token / (rate * 1e9) * 1e3
    print(f"model: Llama-architecture, {bytes_per_token / 1e6:.0f} MB of weights read per "
          f"token (float32), prompt {PROMPT}, {args.tokens} new tokens, {THREADS} threads")
    print(f"read bandwidth: {rate:.1f} GB/s over {bytes_per_token / 1e6:.0f} MB, median of "
          f"{len(rates)} measures ({min(rates):.1f}-{max(rates):.1f}; benchmarks/peak.py); "
          f"floor {floor_ms:.2f} ms per token")
    print(f"{'backend':<18}{'ms/token':>10}{'/floor':>8}{'/eager':>8}{'setup s':>9}  tokens")
    per_token = {}
    for backend in backends:
        long, short = (statistics.median(backend.times[n]) for n in (args.tokens, 1))
        per_token[backend.name] = (long - short) / (args.tokens - 1) * 1e3
    for backend in backends:
        ms = per_token[backend.name]
        eager = per_token.get("eager")
        print(f"{backend.name:<18}{ms:>10.2f}{statistics.median(ratios[backend.name]):>8.2f}"
              f"{ms / eager if eager else float('nan'):>8.2f}{backend.setup_seconds:>9.1f}  "
              f"{'same as ' + names[0] if backend.same else 'DIFFER from ' + names[0]}")


if __name__ == "__main__":
    main()
