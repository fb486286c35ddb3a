"""``seer run``: batch inference over a JSONL file of requests, to a JSONL file of answers with
their statistics (``seer_runtime.batch_inference`` has the formats).

One process, or one per GPU under a launcher, each decoding its share and resuming after a kill::

    seer run --model DIR --input requests.jsonl --output answers.jsonl --batch-size 32 --device cuda
    torchrun --standalone --nproc_per_node 8 -m seer_runtime.cli run --model DIR --input requests.jsonl \\
        --output answers.jsonl --device cuda

Decoding starts from the checkpoint's defaults (``seer_generation_config.json``), then
``--gen-json``, then the options given, then each line's ``options``; every request is seeded
from its content (``rng="per_request"``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..batch_inference import (
    DEFAULT_DIST_TIMEOUT_S,
    BatchDecoder,
    check_output,
    init_data_parallel,
    read_run_requests,
    run_file,
)
from ..config import read_json_object
from .options import (
    add_generation_options,
    add_model_options,
    checkpoint_generation_fields,
    generation_config,
    model_path,
    positive_int,
)


def positive_seconds(text: str) -> float:
    """argparse type: a number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {value}")
    return value


def add_parsers(sub) -> None:
    p = sub.add_parser("run", help="answer a JSONL file of requests (sharded over torchrun / accelerate ranks, "
                                   "resumable)")
    p.add_argument("--model", required=True, type=model_path,
                   help="a local Hugging Face directory (config.json + safetensors), or an embedded model by name "
                        "(demo, arith)")
    p.add_argument("--input", required=True,
                   help="JSONL, one request per line: prompt, optional image (a path relative to the file), "
                        "optional options (GenerationConfig fields), optional id")
    p.add_argument("--output", required=True,
                   help="JSONL of answers in input order; <output>.parts/ holds each rank's answers until the "
                        "end (a run started again on the same output resumes from them)")
    p.add_argument("--batch-size", type=positive_int, default=16, help="requests per generate call (default 16)")
    p.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    p.add_argument("--no-progress", dest="progress_bar", action="store_false", help="no progress bar")
    p.add_argument("--dist-timeout", type=positive_seconds, default=DEFAULT_DIST_TIMEOUT_S,
                   help="seconds a rank waits for the others in a collective before failing (default "
                        f"{DEFAULT_DIST_TIMEOUT_S:.0f}; the last one waits for the slowest rank's share)")
    add_model_options(p)
    add_generation_options(p)
    p.set_defaults(func=cmd_run)


def explicit_fields(args) -> dict:
    """The GenerationConfig fields the checkpoint's file and ``--gen-json`` set (for ``rng``)."""
    fields = checkpoint_generation_fields(args.model)
    if args.gen_json:
        fields.update(read_json_object(args.gen_json, "--gen-json"))
    return fields


def cmd_run(args: argparse.Namespace) -> int:
    requests = read_run_requests(args.input)  # every line checked before the model is loaded
    check_output(Path(args.input), Path(args.output), overwrite=args.overwrite)
    ranks, device = init_data_parallel(args.device, timeout_s=args.dist_timeout)
    rng = explicit_fields(args).get("rng")
    generation = generation_config(args, args.model).to_dict()
    if rng is None:
        generation.pop("rng")  # the library's default ("global") was not asked for: per-request seeds
    decoder = BatchDecoder.load(args.model, generation=generation, seer=args.seer, dyllm=args.dyllm,
                                chat_template=args.chat_template, dtype=args.dtype, device=device,
                                batch_size=args.batch_size)
    run_file(decoder, Path(args.input), Path(args.output), ranks=ranks, requests=requests, overwrite=args.overwrite,
             progress=args.progress_bar, command=args.progress)
    return 0
