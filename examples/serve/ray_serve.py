"""A Blade-optimized model served by two Ray Serve replicas on 127.0.0.1.

    python examples/serve/ray_serve.py [--requests 16] [--workdir DIR]

What a deployment does, in one script (docs/deployment.md walks through it):
1. Build: optimize a transformer encoder layer for any sequence length
   (`Config(dynamic_dims={"x": [1]})`), sign its engines with a team key (an Ed25519 PEM,
   made here with `openssl genpkey`), and save it with `torch.jit.save`.
2. Serve: start Ray with the team's public key in BLADE_TRUSTED_KEYS for every worker
   (the replicas trust that key, and only machine-local keys besides), and deploy two
   replicas that each `torch.jit.load` the saved file once and answer JSON requests.
3. Check: send bounded concurrent requests of several lengths, compare every answer with
   eager PyTorch, and ask each replica for its Blade report (engine calls, fallbacks):
   the engines must have run their compiled code in both replicas. Then shut down.
   With --untrusted the replicas are not given the team key: their engines must refuse
   to map the code, say which key signed it, and answer through the TorchScript fallback.

Exits with status 0 when every answer matched and the engines ran, 1 otherwise.
Needs `pip install -r examples/serve/requirements.txt` (`make serve-example` does it).
"""
import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from pathlib import Path

import torch

import blade

warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated")

HIDDEN = 64
LENGTHS = (8, 13, 32, 5)


def build_model():
    torch.manual_seed(0)
    return torch.nn.TransformerEncoderLayer(HIDDEN, 4, 128, batch_first=True,
                                            dropout=0.0).eval()


def build(workdir: Path) -> Path:
    """Optimizes the model, signed by a team key of its own; returns the saved file."""
    team_key = workdir / "team_signing_key.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(team_key)],
                   check=True)
    config = blade.Config(dynamic_dims={"src": [1]}, signing_key=str(team_key))
    optimized = blade.optimize(build_model(), (torch.randn(1, 16, HIDDEN),), config)
    path = workdir / "encoder.blade.pt"
    torch.jit.save(optimized, str(path))
    return path


class BladeReplica:
    """One replica: loads the saved model once and answers POST {"x": [[[...]]]} with
    {"y": ..., "pid": ...}, and GET /report with its Blade report's counters."""

    def __init__(self, path: str):
        import blade  # noqa: F401  (registers Blade's runtime with TorchScript)

        torch.set_num_threads(1)     # two replicas share the machine's cores
        self.model = torch.jit.load(path)

    async def __call__(self, request):
        if request.url.path.endswith("/report"):
            report = blade.report(self.model)
            return {"pid": os.getpid(), "engine_calls": sum(c.calls for c in report.clusters),
                    "fallbacks": report.runtime_fallbacks,
                    "load_errors": [c.status for c in report.clusters if c.status]}
        x = torch.tensor((await request.json())["x"], dtype=torch.float32)
        with torch.inference_mode():
            y = self.model(x)
        return {"y": y.tolist(), "pid": os.getpid()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, payload: dict, timeout: float = 60.0) -> dict:
    data = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def get(url: str, timeout: float = 60.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def serve_and_check(path: Path, team_public_key: str, requests: int, trusted: bool) -> bool:
    import ray
    from ray import serve

    port = free_port()
    # Every Ray worker (the replicas among them) starts with these variables: the team's
    # key is trusted there, and the replicas' own config directory holds no key of theirs.
    env = {"XDG_CONFIG_HOME": str(path.parent / "replica_config")}
    if trusted:
        env["BLADE_TRUSTED_KEYS"] = team_public_key
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": env})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        deployment = serve.deployment(BladeReplica, name="encoder", num_replicas=2,
                                      ray_actor_options={"num_cpus": 0.5})
        serve.run(deployment.bind(str(path)), name="blade", route_prefix="/encoder")
        url = f"http://127.0.0.1:{port}/encoder"
        model = build_model()
        torch.manual_seed(1)
        inputs = [torch.randn(1, LENGTHS[i % len(LENGTHS)], HIDDEN) for i in range(requests)]
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(lambda x: post(url, {"x": x.tolist()}), inputs))
        seconds = time.perf_counter() - start
        worst = 0.0
        with torch.no_grad():
            for x, answer in zip(inputs, answers):
                worst = max(worst, (torch.tensor(answer["y"]) - model(x)).abs().max().item())
        pids = sorted({a["pid"] for a in answers})
        print(f"{requests} requests in {seconds:.2f} s, answered by replicas {pids}; "
              f"largest difference from eager {worst:.1e}")
        # Each replica's counters: ask until both have answered (the router picks).
        reports, deadline = {}, time.monotonic() + 60
        while len(reports) < 2 and time.monotonic() < deadline:
            report = get(url + "/report")
            reports[report["pid"]] = report
        for pid, report in sorted(reports.items()):
            print(f"replica {pid}: engine calls {report['engine_calls']}, fallbacks "
                  f"{report['fallbacks']}, load errors {report['load_errors'] or 'none'}")
        if trusted:
            engines_as_expected = all(r["engine_calls"] > 0 and r["fallbacks"] == 0 and
                                      not r["load_errors"] for r in reports.values())
        else:   # refused, named why, and the TorchScript fallback answered instead
            engines_as_expected = all(r["fallbacks"] > 0 and r["load_errors"] and all(
                team_public_key in e for e in r["load_errors"]) for r in reports.values())
        ok = worst < 1e-4 and len(reports) == 2 and engines_as_expected and \
            len(answers) == requests
        print("OK" if ok else "FAILED")
        return ok
    finally:
        serve.shutdown()
        ray.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16, help="how many requests to send")
    parser.add_argument("--workdir", help="where the key and the model go (default: a "
                                          "temporary directory)")
    parser.add_argument("--untrusted", action="store_true",
                        help="do not give the replicas the team key: their engines must "
                             "refuse to run their code, say why, and fall back")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        path = build(workdir)
        team_public_key = blade.signing_public_key(workdir / "team_signing_key.pem")
        print(f"built {path.name}, signed by the team key {team_public_key[:16]}...")
        ok = serve_and_check(path, team_public_key, args.requests, not args.untrusted)
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
