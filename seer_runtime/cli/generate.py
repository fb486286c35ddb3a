"""``seer generate``: decode one prompt with a local checkpoint and print the answer and what the call did.

The prompt is the checkpoint's own chat template rendered for one user turn (``--chat-template``
names another), and decoding starts from the checkpoint's defaults (``options.GENERATION_FILE``)
with the options given over them: so the embedded model answers here as it does in ``seer demo``.
``--model`` is a checkpoint directory or the name of an embedded model (``embedded``, ``arith``).

Output: the answer alone on stdout; on stderr a few aligned lines (``seer_runtime.report.summary``:
answer tokens, time and tokens per second, forwards, the work in positions x layers, what each
method saved, the time per phase, the template). ``--stats json`` prints instead one JSON object on
stdout: the answer, the decoding configuration and every statistic (DyLLM's per-forward records
included); ``--stats none`` prints the answer alone. ``--profile PATH`` writes a Chrome trace of
the call (``seer_runtime.profiling.trace``). Nothing else is written.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from ..generation import generate
from ..report import format_rows, stats_dict, summary_rows
from .options import (
    DTYPES,
    add_generation_options,
    add_model_options,
    generation_config,
    model_path,
    model_services,
    non_empty_text,
    path_text,
    policies,
    policy_files,
    progress_of,
)

#: --stats choices: what is printed beside the answer
STATS_CHOICES = ("summary", "json", "none")


def add_parsers(sub) -> None:
    p = sub.add_parser("generate", help="decode one prompt with a local checkpoint",
                       description="Decode one prompt and print the answer (stdout) and what the call did (stderr).")
    p.add_argument("--model", required=True, type=model_path,
                   help="a local Hugging Face directory (config.json + safetensors), or an embedded model by name "
                        "(the --workload names of seer demo): demo (also 'embedded': the LaViDa-LLaDA DMLLM, "
                        "model_adapters/embedded) or arith (the word-problem LLaDA)")
    p.add_argument("--prompt", required=True, type=non_empty_text,
                   help="the user's turn, rendered with the checkpoint's chat template (not empty)")
    p.add_argument("--image", default=None, type=path_text, help="an image file (LaViDa models only)")
    p.add_argument("--stats", default="summary", choices=STATS_CHOICES,
                   help="summary: the answer on stdout, a few aligned lines on stderr; json: one JSON object on "
                        "stdout (answer, generation config, every statistic); none: the answer alone")
    p.add_argument("--profile", default=None, type=path_text, metavar="PATH",
                   help="write a Chrome trace of the generate call (torch.profiler; open in Perfetto or "
                        "chrome://tracing): ranges per stage and per seer:: op")
    p.add_argument("--router", action="store_true",
                   help="run every step through the Padding-Waste-Ratio router (static / varlen / eager path per "
                        "group of requests, after Seer's cut), with its defaults sized to the window")
    add_model_options(p)
    add_generation_options(p)
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    """Everything the model is not needed for is checked before it is loaded: the checkpoint's
    config.json, ``--image`` on a text-only checkpoint and the image file, the chat template and
    the prompt it renders, the generation options, the ``--seer`` / ``--dyllm`` files and the
    ``--profile`` path."""
    from ..files import check_output_path

    svc = model_services()
    progress = progress_of(args)
    progress.stage = "reading the checkpoint"
    checkpoint = svc.check_checkpoint(args.model)
    if args.image and not checkpoint["multimodal"]:
        raise ValueError(f"--image was given, but {args.model} holds a text-only model ({checkpoint['architecture']})")
    tok = svc.load_tokenizer(args.model, chat_template=args.chat_template)
    gen = generation_config(args, args.model)
    prompt_ids = tok.encode_prompt(args.prompt, with_image=bool(args.image))
    files = policy_files(args)
    picture = svc.open_image(args.image, what="--image") if args.image else None
    if args.profile:
        check_output_path(args.profile, option="--profile")
        progress.outputs.append(args.profile)
    progress.stage = "loading the model"
    model = svc.load_model(args.model, dtype=DTYPES[args.dtype], device=args.device)
    images = [svc.prepare_image(model, picture)] if picture is not None else None
    ids = torch.tensor([prompt_ids], device=model.device)
    seer, dyllm = policies(args, model, files)
    progress.start(1)
    run = lambda: generate(model, ids, images=images, gen=gen, seer=seer, dyllm=dyllm,  # noqa: E731
                           router=True if args.router else None, progress=args.stats != "json")
    if args.profile:
        from ..profiling import trace

        with trace(args.profile):
            out = run()
        progress.wrote(args.profile)
    else:
        out = run()
    progress.advance(1)
    answer_ids = out.answer_ids(0)
    answer = tok.decode(answer_ids)
    if args.stats == "json":
        print(json.dumps({"answer": answer, "answer_tokens": len(answer_ids),
                          "complete": int(out.end_positions[0]) >= 0, "chat_template": tok.template.source,
                          "generation": gen.to_dict(), "stats": stats_dict(out.stats)}, indent=1))
        return 0
    print(answer)
    if args.stats == "summary":
        rows = summary_rows(out, gen=gen, answer_tokens=len(answer_ids))
        if int(out.end_positions[0]) < 0:
            rows.insert(1, ("note", "no end token in the window: the answer may be cut (raise --gen-length)"))
        rows.append(("decoding", f"window {gen.gen_length}, block {gen.block}; chat template {tok.template.source}"))
        if args.profile:
            rows.append(("profile", f"{args.profile} (open in https://ui.perfetto.dev or chrome://tracing)"))
        print(format_rows(rows), file=sys.stderr)
    return 0
