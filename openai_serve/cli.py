"""`openai-serve`: load a model, start the engine (its own process by default) and serve the OpenAI
API on uvicorn.

Flags are named like `vllm serve`'s and come from the config dataclasses (openai_serve/settings.py).
The environment is read here and nowhere else: OPENAI_SERVE_API_KEY is the API key when --api-key is
not given.

Start-up order: the settings and the model's directory need no torch, transformers or starlette, so this module
imports none of them before the engine's process is started; the HTTP side (the app, the server, the tokenizer) is
imported and loaded while the child imports torch and builds the engine, two interpreters at once.
"""

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from core.engine_process import EngineProcess
from core.model_files import with_resolved_model
from core.sampling_defaults import load_sampling_defaults
from openai_serve import __version__
from openai_serve.settings import SETTINGS, Settings, add_flags, coerce, load_config_file, settings_from

if TYPE_CHECKING:
    from core.serving_engine import ServingEngine

logger = logging.getLogger("openai_serve")


def build_parser() -> argparse.ArgumentParser:
    # SUPPRESS: only flags actually given land in the namespace, so they can override --config.
    parser = argparse.ArgumentParser(
        prog="openai-serve", argument_default=argparse.SUPPRESS,
        description="OpenAI-compatible LLM server: /v1/completions, /v1/chat/completions, /v1/responses, /v1/models, "
        "streaming over server-sent events.",
    )
    parser.add_argument("model_tag", nargs="?", metavar="MODEL", help="the model to serve, as --model takes it (as "
                        "in `vllm serve MODEL`)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--config", help="JSON file of settings (keys: these flags' long names); flags override it")
    add_flags(parser)
    return parser


def parse_settings(argv: list[str] | None = None) -> Settings:
    parser = build_parser()
    flags = vars(parser.parse_args(argv))
    model_tag = flags.pop("model_tag", None)
    if model_tag is not None:
        if flags.get("model", model_tag) != model_tag:
            parser.error(f"MODEL {model_tag!r} and --model {flags['model']!r} disagree; give one")
        flags["model"] = model_tag
    config_path = flags.pop("config", None)
    try:
        values = load_config_file(config_path) if config_path else {}
        values |= {name: coerce(SETTINGS[name], value) for name, value in flags.items()}
        if values.get("api_key") is None:
            values["api_key"] = os.environ.get("OPENAI_SERVE_API_KEY") or None
        return settings_from(values)
    except ValueError as exc:
        parser.error(str(exc))


def start_engine(settings: Settings) -> Callable[[], "ServingEngine"]:
    """Starts the engine in its own process (the default) and returns the wait for it to be ready; with the engine
    in this process (a thread of the bridge), returns its construction, as nothing can overlap it."""
    if settings.server.engine_process:
        return EngineProcess.spawned(settings.engine, log_level=settings.server.log_level.upper()).wait_until_ready
    from core.engine import LLMEngine

    return lambda: LLMEngine(settings.engine)


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(argv)
    log_format = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=settings.server.log_level.upper(), format=log_format)
    try:
        engine_config, model = with_resolved_model(settings.engine)
        settings = settings.with_model(engine_config, model.name)
        m = engine_config.model
        sampling_defaults = load_sampling_defaults(m.model, m.generation_config, m.override_generation_config)
        engine_ready = start_engine(settings)
        # Imported and loaded while the engine's process starts (see the module's docstring).
        start = time.perf_counter()
        from core.tokenizer import load_tokenizer
        from openai_serve.app import build_app
        from openai_serve.server import ServingServer

        tokenizer = load_tokenizer(m.tokenizer or m.model)
        logger.info("imported the server and loaded the tokenizer in %.1f s; waiting for the engine",
                    time.perf_counter() - start)
        engine = engine_ready()
    except (ValueError, OSError, RuntimeError) as exc:
        sys.exit(f"openai-serve: {exc}")
    config = settings.server
    logger.info("serving %s (context %d tokens) as %s on http://%s:%d/v1", engine.config.model.model,
                engine.max_model_len, ", ".join(config.served_model_names), config.host, config.port)
    app = build_app(engine, config, tokenizer=tokenizer, sampling_defaults=sampling_defaults)
    server = ServingServer(app, config)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled; the shutdown was clean
        pass
    if server.exit_code:
        sys.exit(server.exit_code)
