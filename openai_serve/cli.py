"""`openai-serve`: load a model, start the engine thread and serve the OpenAI API on uvicorn.

Flags are named like `vllm serve`'s. The environment is read here and nowhere else:
OPENAI_SERVE_API_KEY is the API key when --api-key is not given.
"""

import argparse
import logging
import os
import sys
from pathlib import Path

from core import LLMEngine
from core.engine_process import EngineProcess
from core.serving_engine import ServingEngine
from openai_serve import __version__
from openai_serve.app import build_app
from openai_serve.chat_template import load_chat_template
from openai_serve.server import ServingServer
from openai_serve.settings import DEFAULTS, engine_config, load_config_file, merge, server_config

logger = logging.getLogger("openai_serve")


def build_parser() -> argparse.ArgumentParser:
    # SUPPRESS: only flags actually given land in the namespace, so they can override --config.
    p = argparse.ArgumentParser(
        prog="openai-serve", argument_default=argparse.SUPPRESS,
        description="OpenAI-compatible LLM server: /v1/completions, /v1/chat/completions, /v1/models, "
        "streaming over server-sent events.",
    )
    d = DEFAULTS
    p.add_argument("model_tag", nargs="?", metavar="MODEL", help="the model to serve, as --model takes it (as in "
                   "`vllm serve MODEL`)")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--config", help="JSON file of settings (keys: these flags' long names); flags override it")
    p.add_argument("--model", help="local checkpoint directory or Hugging Face Hub id; when omitted, a built-in "
                   "tiny random model (gibberish output, for trying the server out)")
    p.add_argument("--served-model-name", nargs="+", help="name(s) clients use in 'model' (default: --model)")
    p.add_argument("--host", help=f"address to bind (default {d['host']})")
    p.add_argument("--port", type=int, help=f"port to bind (default {d['port']})")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (default: $OPENAI_SERVE_API_KEY, else none)")
    p.add_argument("--allowed-origins", help="CORS origins: a JSON list or comma-separated; '' disables CORS "
                   "(default: *)")
    p.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    p.add_argument("--max-num-seqs", type=int, help=f"most sequences in one batch (default {d['max_num_seqs']})")
    p.add_argument("--max-num-batched-tokens", type=int,
                   help=f"token budget of one engine step (default {d['max_num_batched_tokens']})")
    p.add_argument("--block-size", type=int, help=f"tokens per KV-cache block (default {d['block_size']})")
    p.add_argument("--kv-cache-blocks", type=int, help="number of KV-cache blocks (default: sized from memory)")
    p.add_argument("--gpu-memory-utilization", type=float,
                   help=f"share of GPU memory for weights and KV cache (default {d['gpu_memory_utilization']})")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="weights' dtype (default auto)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], help="where the model runs (default auto)")
    p.add_argument("--enforce-eager", action="store_true", help="never use CUDA graphs")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   help="reuse KV blocks of shared prompt prefixes (default on)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                   help="queue each step on the device before collecting the previous one's tokens (default on)")
    p.add_argument("--engine-process", action=argparse.BooleanOptionalAction,
                   help="run the engine in its own process, off the HTTP side's interpreter lock "
                   f"(default {'on' if d['engine_process'] else 'off'})")
    p.add_argument("--attention-backend", choices=["auto", "torch", "triton", "flash-attn"],
                   help="attention implementation (default auto)")
    p.add_argument("--chat-template", help="Jinja chat template (a file, or the template text) replacing the model's")
    p.add_argument("--seed", type=int, help=f"seed of unseeded sampling (default {d['seed']})")
    p.add_argument("--max-request-body-bytes", type=int, help="larger request bodies get 413 (default 32 MiB)")
    p.add_argument("--max-pending-requests", type=int,
                   help=f"requests in flight (n choices count n) before new ones get 503 "
                   f"(default {d['max_pending_requests']})")
    p.add_argument("--gil-switch-interval-ms", type=float,
                   help="how long the HTTP thread may hold Python's interpreter lock while the engine thread waits "
                   f"for it (default {d['gil_switch_interval_ms']})")
    p.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"], help="(default info)")
    return p


def parse_settings(argv: list[str] | None = None) -> dict[str, object]:
    parser = build_parser()
    flags = vars(parser.parse_args(argv))
    model_tag = flags.pop("model_tag", None)
    if model_tag is not None:
        if flags.get("model", model_tag) != model_tag:
            parser.error(f"MODEL {model_tag!r} and --model {flags['model']!r} disagree; give one")
        flags["model"] = model_tag
    config_path = flags.pop("config", None)
    try:
        file_settings = load_config_file(config_path) if config_path else {}
    except ValueError as exc:
        parser.error(str(exc))
    settings = merge(file_settings, flags)
    if settings["api_key"] is None:
        settings["api_key"] = os.environ.get("OPENAI_SERVE_API_KEY") or None
    return settings


def resolve_model(model: str | None) -> str:
    """A checkpoint directory for --model: as given, downloaded from the Hub, or the built-in one."""
    if model is None:
        from core.tiny_model import default_model_dir

        path = default_model_dir()
        logger.warning("no --model given: serving the built-in tiny random Qwen3 model at %s. Its output is "
                       "gibberish; pass --model to serve a real one.", path)
        return str(path)
    if Path(model).is_dir():
        return model
    from huggingface_hub import snapshot_download

    logger.info("downloading %s from the Hugging Face Hub", model)
    return snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(argv)
    log_format = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=str(settings["log_level"]).upper(), format=log_format)
    try:
        config = server_config(settings, load_chat_template(settings["chat_template"]))  # type: ignore[arg-type]
        config_of_engine = engine_config(settings, resolve_model(settings["model"]))  # type: ignore[arg-type]
        engine: ServingEngine
        if settings["engine_process"]:
            engine = EngineProcess(config_of_engine, log_level=str(settings["log_level"]).upper())
        else:
            engine = LLMEngine(config_of_engine)
    except (ValueError, OSError, RuntimeError) as exc:
        sys.exit(f"openai-serve: {exc}")
    logger.info("serving %s (context %d tokens) as %s on http://%s:%d/v1", engine.config.model.model,
                engine.max_model_len, ", ".join(config.served_model_names), config.host, config.port)
    try:
        ServingServer(build_app(engine, config), config).run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled; the shutdown was clean
        pass
