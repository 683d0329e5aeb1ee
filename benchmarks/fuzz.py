"""A long fuzzing run of the decoders a network peer reaches, and its count.

Runs plugins/pcp-capnp-tcp/tests/test_fuzz.py (the frame decoders) and
plugins/pcp-codecs/tests/test_fuzz.py (every codec's decoder) through pytest with
PCP_FUZZ_EXAMPLES examples per test instead of the quick default, and writes
benchmarks/results/fuzz.json:
the inputs each test tried and their sum per decoder, whether every test passed, the
hypothesis version, the duration and the command, so the figure can be reproduced.

    python benchmarks/fuzz.py                   # 20000 examples per test
    python benchmarks/fuzz.py --examples 2000   # a shorter run
    python benchmarks/fuzz.py --examples 30000 --files plugins/pcp-codecs/tests/test_fuzz.py \
        --out benchmarks/results/fuzz_codecs.json   # the codecs alone
"""

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PYTEST_OPTIONS = ["-q", "-p", "no:cacheprovider"]
FILES = ["plugins/pcp-capnp-tcp/tests/test_fuzz.py", "plugins/pcp-codecs/tests/test_fuzz.py"]
# test name prefix: the decoder it feeds (receive runs header.decode too, after the prefix;
# a codec test's id ends in the codec's name, [int8], which names the decoder's codec)
DECODERS = {
    "test_header_decode_": "pcp_capnp_tcp.header.decode",
    "test_receive_": "pcp_capnp_tcp.connection.CapnpConnection.receive",
    "test_codec_decode_": "pcp_core.codecs.decode_tensor",
}


def decoder_of(test: str) -> str:
    """The decoder a fuzz test feeds, by its name."""
    for prefix, decoder in DECODERS.items():
        if test.startswith(prefix):
            return decoder + (test[test.index("[") :] if "[" in test else "")
    raise KeyError(f"{test} feeds no decoder in DECODERS; add it")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20000, help="examples per test")
    parser.add_argument("--files", nargs="+", default=FILES, help="fuzz test files to run")
    parser.add_argument(
        "--out", type=Path, default=RESULTS / "fuzz.json", help="results file (%(default)s)"
    )
    args = parser.parse_args()
    pytest_args = [*PYTEST_OPTIONS, *args.files]
    command = [sys.executable, "-m", "pytest", *pytest_args]
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "tried.json"
        env = os.environ | {"PCP_FUZZ_EXAMPLES": str(args.examples), "PCP_FUZZ_REPORT": str(report)}
        started = time.monotonic()
        exit_code = subprocess.run(command, cwd=ROOT, env=env, check=False).returncode
        duration_s = time.monotonic() - started
        tried: dict[str, int] = json.loads(report.read_text()) if report.exists() else {}
    per_decoder: dict[str, int] = {}
    for test, count in sorted(tried.items()):
        per_decoder[decoder_of(test)] = per_decoder.get(decoder_of(test), 0) + count
    result = {
        "command": f"PCP_FUZZ_EXAMPLES={args.examples} "
        + shlex.join(["python", "-m", "pytest", *pytest_args]),
        "examples_per_test": args.examples,
        "passed": exit_code == 0,
        "inputs_tried_per_decoder": per_decoder,
        "inputs_tried_per_test": tried,
        "hypothesis": version("hypothesis"),
        "duration_s": round(duration_s, 1),
        "machine": {
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "python": platform.python_version(),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    sys.exit(exit_code)


if __name__ == "__main__":
    main()
