"""The ``seer`` command line: ``seer generate``, ``seer demo``, ``seer calibrate``, ``seer calibrate-dyllm``.

Model loading, tokenizers and images come from the model layer through the ``seer.models``
entry point (``model_adapters.services``); this module only parses options and prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import entry_points


def model_services():
    """The registered model layer (``model_adapters.services`` unless another package registers)."""
    found = list(entry_points(group="seer.models"))
    if not found:
        raise RuntimeError("no 'seer.models' entry point is installed: run `pip install -e .` in the repository")
    chosen = next((e for e in found if e.name == "default"), found[0])
    return chosen.load()


def _add_generation_options(p: argparse.ArgumentParser, *, with_policies: bool = True) -> None:
    g = p.add_argument_group("generation")
    g.add_argument("--gen-length", type=int, default=None, help="response window (default: 128, or the JSON's)")
    g.add_argument("--steps", type=int, default=None, help="denoising steps (default: gen_length)")
    g.add_argument("--block-length", type=int, default=None, help="semi-autoregressive block (LLaDA family)")
    g.add_argument("--temperature", type=float, default=None, help="0 = argmax (default)")
    g.add_argument("--remasking", default=None, help="LLaDA family: low_confidence|random|margin|entropy")
    g.add_argument("--alg", default=None, help="Dream family: origin|maskgit_plus|topk_margin|entropy")
    g.add_argument("--cfg-scale", type=float, default=None, help="classifier-free guidance scale (LLaDA family)")
    g.add_argument("--schedule", default=None, help="shift|cosine|logit_normal|uniform (LaViDa)")
    g.add_argument("--step-ratio", type=float, default=None, help="LaViDa: steps per block scaled by this ratio (0, 1]")
    g.add_argument("--prefix-cache", dest="prefix_cache", action="store_true", default=None)
    g.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false")
    g.add_argument("--gen-json", default=None, help="a JSON file of GenerationConfig fields")
    if not with_policies:
        return
    g.add_argument("--seer", default=None, help="a SeerConfig JSON file (from `seer calibrate`) to cut the window")
    g.add_argument("--dyllm", default=None,
                   help="a DyLLMConfig JSON file (from `seer calibrate-dyllm`), or 'default' (the paper's "
                        "settings: the family's tau, 4 warm-up steps, prompt every 4th step; partial attention "
                        "corrected for the salient keys' change)")


def generation_config(args):
    from .config import GenerationConfig

    fields = json.load(open(args.gen_json)) if args.gen_json else {}
    for name in ("gen_length", "steps", "block_length", "temperature", "remasking", "alg", "cfg_scale", "schedule",
                 "step_ratio", "prefix_cache"):
        value = getattr(args, name)
        if value is not None:
            fields[name] = value
    return GenerationConfig.from_dict(fields)


def policies(args, model):
    seer = dyllm = None
    if getattr(args, "seer", None):
        from .seer import SeerConfig

        seer = SeerConfig.from_json(args.seer)
    if getattr(args, "dyllm", None):
        from .dyllm import DyLLMConfig

        dyllm = DyLLMConfig.for_model(model) if args.dyllm == "default" else DyLLMConfig.from_json(args.dyllm)
    return seer, dyllm


def cmd_generate(args) -> int:
    import torch

    from .engine import generate

    svc = model_services()
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, None: None}[args.dtype]
    model = svc.load_model(args.model, dtype=dtype, device=args.device)
    tok = svc.load_tokenizer(args.model)
    images = None
    if args.image:
        images = [svc.load_image(model, args.image)]
    ids = torch.tensor([tok.encode_prompt(args.prompt, with_image=bool(args.image))], device=model.device)
    gen = generation_config(args)
    seer, dyllm = policies(args, model)
    out = generate(model, ids, images=images, gen=gen, seer=seer, dyllm=dyllm, progress=True)
    print(tok.decode(out.answer_ids(0)))
    st = out.stats
    print(f"\n[stats] NFE {st.nfe}  steps {st.steps[0]}  tokens computed {st.tokens_computed:,}  "
          + "  ".join(f"{k} {v:.3f}s" for k, v in st.time_s.items()), file=sys.stderr)
    for key, value in st.extra.items():
        print(f"[stats] {key}: {value}", file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    from .demo import main as demo_main

    return demo_main(args)


def cmd_calibrate(args) -> int:
    from .calibrate import main as calibrate_main

    return calibrate_main(args)


def cmd_calibrate_dyllm(args) -> int:
    from .calibrate_dyllm import main as calibrate_dyllm_main

    return calibrate_dyllm_main(args)


def _add_calibration_inputs(p: argparse.ArgumentParser) -> None:
    """The options both calibrate commands read their requests with (``calibrate.load_calibration_inputs``)."""
    p.add_argument("--model", default=None,
                   help="a local checkpoint with its tokenizer.json (default: the embedded model); needs --data")
    p.add_argument("--data", default=None,
                   help="JSONL, one request per line: question, optional image (path relative to the file), "
                        "optional answer (default: the embedded model's calibration split)")
    p.add_argument("--requests", type=int, default=None, help="use only the first N requests of the data")
    p.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    p.add_argument("--device", default="cpu")
    _add_generation_options(p, with_policies=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="seer", description="Fast inference for diffusion LLMs and diffusion MLLMs.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="decode one prompt with a local checkpoint")
    p.add_argument("--model", required=True, help="a local Hugging Face directory (config.json + safetensors)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--image", default=None, help="an image file (LaViDa models)")
    p.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    p.add_argument("--device", default="cpu")
    _add_generation_options(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("demo", help="baseline vs Seer on the embedded model (what `make demo` runs)")
    p.add_argument("--requests", type=int, default=None, help="held-out requests (default: the demo's)")
    p.add_argument("--batch-size", type=int, default=None, help="requests per batch (default: the demo's)")
    p.add_argument("--json", default=None, help="write the figures as JSON to this path")
    p.add_argument("--plot", default=None, help="write the step-0 sparsity plot (PNG) to this path")
    p.add_argument("--model", default=None, help="a model directory instead of the embedded model")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("calibrate", help="choose Seer's probe layer, eps, tau_jump and gamma for a checkpoint")
    _add_calibration_inputs(p)
    p.add_argument("--out", default="seer_config.json",
                   help="where to write the chosen SeerConfig (JSON accepted by `generate --seer` and the demo)")
    p.add_argument("--lam", type=float, default=0.1, help="lambda of U = accuracy ratio + lambda log(speed-up)")
    p.add_argument("--plot", default=None, help="write the per-layer step-0 sparsity profiles (PNG) to this path")
    p.add_argument("--guard-mode", default="extend", choices=["extend", "redecode"],
                   help="the over-truncation guard written into the choice: extend the window with masks "
                        "(cheaper) or decode the request again on the full window (answers equal the baseline's)")
    p.add_argument("--rank-by", default="tokens", choices=["tokens", "wall"],
                   help="speed-up inside U: tokens-computed ratio (deterministic) or wall clock")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("calibrate-dyllm", help="choose DyLLM's tau and attention mode for a checkpoint")
    _add_calibration_inputs(p)
    p.add_argument("--out", default="dyllm_config.json",
                   help="where to write the chosen DyLLMConfig (JSON accepted by `generate --dyllm`)")
    p.add_argument("--max-drop", type=float, default=0.01,
                   help="largest exact-match loss against the baseline a choice may have (0.01 = one point)")
    p.add_argument("--full-steps", type=int, default=4, help="warm-up steps of every candidate")
    p.add_argument("--prompt-period", type=int, default=4, help="prompt fed every N-th step in every candidate")
    p.set_defaults(func=cmd_calibrate_dyllm)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"seer {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
