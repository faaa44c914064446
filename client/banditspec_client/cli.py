"""The ``banditspec`` command.

Subcommands import what they need lazily, so ``banditspec --help`` is instant.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from banditspec.bandits.registry import POLICY_CHOICES
from banditspec.config import DEFAULT_MAX_DRAFT_LEN, DEFAULT_POLICY


def _add_generation_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="the prompt text (one user turn; the chat template is applied)")
    p.add_argument("--policy", default=DEFAULT_POLICY, help=" | ".join((*POLICY_CHOICES, "fixed:<arm>")))
    p.add_argument("--arms", default=None, help="comma-separated arms, e.g. pld,suffix@2,rest (default: all)")
    p.add_argument("--max-draft-len", type=int, default=DEFAULT_MAX_DRAFT_LEN, help="L, the longest speculation")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: a fresh one, reported in the stats)")
    p.add_argument("--stop", action="append", default=[], help="stop word (repeatable)")
    p.add_argument("--reward", default="accepted", choices=["accepted", "throughput"])
    p.add_argument("--no-chat", action="store_true", help="send the prompt as raw text, no chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    p.add_argument("--stream", action="store_true", help="print text as it is accepted")


def _cmd_generate(args: argparse.Namespace) -> int:
    if args.url:
        from banditspec_client.triton_client import generate_remote

        return generate_remote(args)
    return _generate_local(args)


def _generate_local(args: argparse.Namespace) -> int:
    from banditspec.config import GenerationRequest, fresh_seed
    from banditspec.decoding.session import generate
    from banditspec.serving.runtime import DEFAULT_ARMS, load_local
    from banditspec.text import IncrementalDetokenizer, prompt_ids, stop_sequences

    stack = load_local(args.model, DEFAULT_ARMS)
    tok = stack.tokenizer
    request = GenerationRequest(
        prompt_ids=prompt_ids(tok, args.prompt, chat=not args.no_chat),
        max_tokens=args.max_tokens,
        policy=args.policy,
        arms=args.arms.split(",") if args.arms else None,
        max_draft_len=args.max_draft_len,
        temperature=args.temperature,
        seed=args.seed if args.seed is not None else fresh_seed(),
        stop_sequences=stop_sequences(tok, args.stop),
        reward=args.reward,
    )
    session = stack.decoder.start(request)
    detok = IncrementalDetokenizer(tok)
    started = time.perf_counter()
    for event in generate(stack.engine, session):
        delta = detok.push(event.new_token_ids, final=event.finished)
        if args.stream and not args.json and delta:
            print(delta, end="", flush=True)
    elapsed = time.perf_counter() - started
    result = session.result()
    stats = result.stats.as_dict()
    stats["tokens_per_second"] = round(len(result.token_ids) / elapsed, 3) if elapsed > 0 else 0.0
    stats["finish_reason"] = result.finish_reason
    if args.json:
        print(json.dumps({"text": detok.text, "token_ids": result.token_ids, "stats": stats}))
    else:
        if not args.stream:
            print(detok.text)
        else:
            print()
        print(_summary(stats), file=sys.stderr)
    return 0


def _summary(stats: dict[str, Any]) -> str:
    arms = ", ".join(f"{a}: {v['pulls']} pulls, {v['accepted']}/{v['drafted']} accepted" for a, v in stats["per_arm"].items())
    return (
        f"[{stats['generated_tokens']} tokens in {stats['steps']} steps, "
        f"mean accepted tokens {stats['mean_accepted_tokens']:.2f}, {stats['tokens_per_second']:.1f} tokens/s; {arms}]"
    )


def _cmd_build(args: argparse.Namespace) -> int:
    if args.what == "model":
        from banditspec.engine.models import model_dir

        for name in args.models.split(","):
            print(f"{name}: {model_dir(name)}")
        return 0
    if args.what == "rest":
        from banditspec.drafters.rest_datastore import default_datastore
        from banditspec.engine.models import load_tokenizer

        print(default_datastore(load_tokenizer("smollm2")))
        return 0
    if args.what == "kernels":
        from banditspec.drafters.rest_datastore import build_text_search
        from banditspec.engine import panel_kernel

        print(panel_kernel.build(force=args.force))
        print(build_text_search(force=args.force))
        if panel_kernel.load() is None:
            print(f"warning: built, but it cannot run here: {panel_kernel.unavailable_reason()}")
        return 0
    from banditspec_train.eagle import train

    return train.run(args)


# Subcommands that delegate to a module's add_arguments(parser) / run(args): (name, module, help).
MODULE_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("serve", "banditspec_server.serve", "start a real tritonserver with this model repository"),
    ("openai", "banditspec_server.openai_api.server", "OpenAI-compatible HTTP API in front of a running Triton"),
    ("demo", "banditspec_client.demo", "start Triton, send a few prompts, compare with plain decoding"),
    ("simulate", "banditspec.evaluation.simulate", "bandit regret on synthetic arms (the paper's TGD)"),
    ("bench", "banditspec_client.bench.compare.command", "benchmark methods side by side (paper Table 1)"),
    ("bench-overhead", "banditspec_client.bench.overhead", "tokens/s through Triton vs in process, side by side"),
    ("bench-load", "banditspec_client.bench.concurrency.command", "closed-loop load sweep through Triton gRPC and the OpenAI API: tok/s, TTFT, ITL"),
    ("bench-drafters", "banditspec_client.bench.drafters", "proposal cost of each drafter"),
    ("replay", "banditspec_client.replay", "score every policy offline and exactly from recorded traces (tune, compare)"),
    ("bench-engine", "banditspec_client.bench.engine", "verify cost over k new tokens and decode rate of the target engine"),
    ("soak", "banditspec_client.soak.command", "bounded soak of a real tritonserver: mixed traffic, memory, KV, /dev/shm"),
)


def _delegate(module: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        import importlib

        return importlib.import_module(module).run(args)

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="banditspec", description="BanditSpec adaptive speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text, in process (--local) or through Triton (--url)")
    where = gen.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true", help="run in this process (default without --url)")
    where.add_argument("--url", help="Triton address, e.g. localhost:8001 (gRPC) or localhost:8000 (HTTP)")
    gen.add_argument("--protocol", choices=["grpc", "http"], default="grpc")
    gen.add_argument("--model", default="smollm2", choices=["smollm2", "tiny"], help="local target model")
    gen.add_argument("--model-name", default="banditspec", help="Triton model to call")
    _add_generation_options(gen)
    gen.set_defaults(func=_cmd_generate)

    build = sub.add_parser("build", help="build artefacts into the cache: model | rest | kernels | eagle")
    build_sub = build.add_subparsers(dest="what", required=True)
    model = build_sub.add_parser("model", help="convert SmolLM2 (GGUF) and the tiny test model")
    model.add_argument("--models", default="smollm2,tiny")
    build_sub.add_parser("rest", help="the default REST datastore")
    kernels = build_sub.add_parser("kernels", help="compile the C libraries: the engine's kernels, REST's text search (needs a C compiler)")
    kernels.add_argument("--force", action="store_true", help="rebuild even when cached")
    eagle = build_sub.add_parser("eagle", help="train the Eagle draft head")
    _try_add_arguments("banditspec_train.eagle.train", eagle)
    build.set_defaults(func=_cmd_build)

    for name, module, help_text in MODULE_COMMANDS:
        command = sub.add_parser(name, help=help_text)
        _try_add_arguments(module, command)
        command.set_defaults(func=_delegate(module))
    return parser


def _try_add_arguments(module: str, parser: argparse.ArgumentParser) -> None:
    import importlib

    importlib.import_module(module).add_arguments(parser)


def main(argv: list[str] | None = None) -> int:
    from banditspec.errors import BanditSpecValidationError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BanditSpecValidationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
