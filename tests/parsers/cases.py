"""Recorded answers in each family's format, as the model's text reaches the parsers (special tokens
kept, the stop token's text left out), with the OpenAI message each must parse to.

Each family has plain text, one call, parallel calls, reasoning then a call (the `</think>` -> call
hand-off), and a malformed call, which must come out as content, as written. Values carry multi-byte
characters, and DeepSeek's tags are themselves made of them, so splits inside both are tried.
"""

from dataclasses import dataclass, field

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather and forecast for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "the city's name"},
        "days": {"type": "integer", "description": "days of forecast"},
        "detail": {"type": "object", "properties": {"wind": {"type": "boolean"}}},
    }, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]

Call = tuple[str, dict[str, object]]


@dataclass(frozen=True)
class Case:
    name: str
    text: str
    content: str | None = None  # the message's content (None: null, as OpenAI sends it)
    reasoning: str | None = None
    calls: list[Call] = field(default_factory=list)
    prompt: str = ""  # the prompt's end, where it tells whether the answer starts in thinking


@dataclass(frozen=True)
class Family:
    tool_call_parser: str
    reasoning_parser: str | None
    cases: list[Case]
    # (what, instead) in the one-call case's text: the same call with an argument its schema refuses
    wrong_type: tuple[str, str] = ("", "")
    # (what, instead) in the one-call case's text: a call that breaks off after it has begun
    broken: tuple[str, str] = ('"days": 3', '"days": 3 oops')


PARIS = ("get_weather", {"city": "Paris"})
SAO_PAULO = ("get_weather", {"city": "São Paulo", "days": 3})
TOKYO_WIND = ("get_weather", {"city": "東京", "detail": {"wind": True}})
UTC = ("get_time", {"zone": "UTC"})
TEXT = "Paris is sunny today ☀️, ça va? 2 < 3 and [x] {y}."


def _qwen3_coder_call(name: str, **arguments: str) -> str:
    parameters = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in arguments.items())
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"


QWEN3_CODER = Family("qwen3_coder", "qwen3", [
    Case("text", TEXT, content=TEXT),
    Case("one call", _qwen3_coder_call("get_weather", city="São Paulo", days="3"), calls=[SAO_PAULO]),
    Case("parallel calls", "I'll check both.\n\n" + _qwen3_coder_call("get_weather", city="Paris") + "\n"
         + _qwen3_coder_call("get_time", zone="UTC"), content="I'll check both.", calls=[PARIS, UTC]),
    Case("reasoning then call", "<think>\nThe user wants the weather; 2 < 3.\n</think>\n\n"
         + _qwen3_coder_call("get_weather", city="東京", detail='{"wind": true}'),
         reasoning="\nThe user wants the weather; 2 < 3.\n", calls=[TOKYO_WIND]),
    Case("open think in the prompt", "Weather first.</think>" + _qwen3_coder_call("get_time", zone="UTC"),
         reasoning="Weather first.", calls=[UTC], prompt="<|im_start|>assistant\n<think>\n"),
    Case("malformed call", "Let me try <tool_call>\nget_weather(city='Paris')\n</tool_call> done",
         content="Let me try <tool_call>\nget_weather(city='Paris')\n</tool_call> done"),
], wrong_type=("<parameter=days>\n3\n", "<parameter=days>\nthree\n"),
   broken=("<parameter=days>", "oops <parameter=days>"))


def _hermes_call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


HERMES = Family("hermes", "qwen3", [
    Case("text", TEXT, content=TEXT),
    Case("one call", _hermes_call("get_weather", '{"city": "São Paulo", "days": 3}'), calls=[SAO_PAULO]),
    Case("parallel calls", "Both:\n" + _hermes_call("get_weather", '{"city": "Paris"}') + "\n"
         + _hermes_call("get_time", '{"zone": "UTC"}'), content="Both:", calls=[PARIS, UTC]),
    Case("reasoning then call", "<think>\nCall it.\n</think>\n\n"
         + _hermes_call("get_weather", '{"city": "東京", "detail": {"wind": true}}'),
         reasoning="\nCall it.\n", calls=[TOKYO_WIND]),
    Case("malformed call", "<tool_call>\nget_weather Paris\n</tool_call>",
         content="<tool_call>\nget_weather Paris\n</tool_call>"),
], wrong_type=('"days": 3', '"days": "3"'))


def _glm_call(name: str, newlines: bool = True, **arguments: str) -> str:
    gap = "\n" if newlines else ""
    pairs = "".join(f"<arg_key>{key}</arg_key>{gap}<arg_value>{value}</arg_value>{gap}"
                    for key, value in arguments.items())
    return f"<tool_call>{name}{gap}{pairs}</tool_call>"


GLM45 = Family("glm45", "glm45", [
    Case("text", TEXT, content=TEXT),
    Case("one call", _glm_call("get_weather", city="São Paulo", days="3"), calls=[SAO_PAULO]),
    Case("parallel calls", "Checking." + _glm_call("get_weather", newlines=False, city="Paris")
         + _glm_call("get_time", newlines=False, zone="UTC"), content="Checking.", calls=[PARIS, UTC]),
    Case("reasoning then call", "\n<think>The user wants weather.</think>\n"
         + _glm_call("get_weather", city="東京", detail='{"wind": true}'),
         reasoning="The user wants weather.", calls=[TOKYO_WIND]),
    Case("open think in the prompt", "Time.</think>" + _glm_call("get_time", newlines=False, zone="UTC"),
         reasoning="Time.", calls=[UTC], prompt="<|assistant|><think>"),
    Case("malformed call", 'Sure <tool_call>\n{"name": "get_weather"}\n</tool_call>',
         content='Sure <tool_call>\n{"name": "get_weather"}\n</tool_call>'),
], wrong_type=("<arg_value>3</arg_value>", "<arg_value>three</arg_value>"),
   broken=("<arg_key>days", "oops<arg_key>days"))

DS_CALLS, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"


def _ds_call(name: str, arguments: str) -> str:
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>"


def _ds_v3_call(name: str, arguments: str) -> str:
    return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{arguments}\n```<｜tool▁call▁end｜>"


DS_NO_THINKING, DS_THINKING = "<｜Assistant｜><think></think>", "<｜Assistant｜><think>"
DEEPSEEK_V31 = Family("deepseek_v31", "deepseek_v3", [
    Case("text", TEXT, content=TEXT, prompt=DS_NO_THINKING),
    Case("one call", DS_CALLS + _ds_call("get_weather", '{"city": "São Paulo", "days": 3}') + DS_CALLS_END,
         calls=[SAO_PAULO], prompt=DS_NO_THINKING),
    Case("parallel calls", "Zürich? Both." + DS_CALLS + _ds_call("get_weather", '{"city": "Paris"}')
         + _ds_call("get_time", '{"zone": "UTC"}') + DS_CALLS_END, content="Zürich? Both.", calls=[PARIS, UTC],
         prompt=DS_NO_THINKING),
    Case("reasoning then call", "The user wants weather.</think>" + DS_CALLS
         + _ds_call("get_weather", '{"city": "東京", "detail": {"wind": true}}') + DS_CALLS_END,
         reasoning="The user wants weather.", calls=[TOKYO_WIND], prompt=DS_THINKING),
    Case("malformed call", DS_CALLS + _ds_call("get_weather", "Paris please") + DS_CALLS_END,
         content=DS_CALLS + _ds_call("get_weather", "Paris please") + DS_CALLS_END, prompt=DS_NO_THINKING),
], wrong_type=('"days": 3', '"days": "3"'))

DEEPSEEK_V3 = Family("deepseek_v3", "deepseek_r1", [
    Case("text", "</think>" + TEXT, content=TEXT, prompt="<｜Assistant｜>"),
    Case("one call", "</think>" + DS_CALLS + _ds_v3_call("get_weather", '{"city": "São Paulo", "days": 3}')
         + DS_CALLS_END, calls=[SAO_PAULO], prompt="<｜Assistant｜>"),
    Case("parallel calls", "</think>" + DS_CALLS + _ds_v3_call("get_weather", '{"city": "Paris"}') + "\n"
         + _ds_v3_call("get_time", '{"zone": "UTC"}') + DS_CALLS_END, calls=[PARIS, UTC], prompt="<｜Assistant｜>"),
    Case("reasoning then call", "<think>\nWeather.\n</think>\n\n" + DS_CALLS
         + _ds_v3_call("get_weather", '{"city": "東京", "detail": {"wind": true}}') + DS_CALLS_END,
         reasoning="\nWeather.\n", calls=[TOKYO_WIND], prompt="<｜Assistant｜>"),
    Case("malformed call", "</think>" + DS_CALLS + "<｜tool▁call▁begin｜>function get_weather<｜tool▁call▁end｜>",
         content=DS_CALLS + "<｜tool▁call▁begin｜>function get_weather<｜tool▁call▁end｜>", prompt="<｜Assistant｜>"),
], wrong_type=('"days": 3', '"days": "3"'))

KIMI_CALLS, KIMI_CALLS_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"


def _kimi_call(name: str, index: int, arguments: str) -> str:
    return f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"


KIMI_K2 = Family("kimi_k2", "kimi_k2", [
    Case("text", TEXT, content=TEXT),
    Case("one call", KIMI_CALLS + _kimi_call("get_weather", 0, '{"city": "São Paulo", "days": 3}') + KIMI_CALLS_END,
         calls=[SAO_PAULO]),
    Case("parallel calls", "Looking up both. " + KIMI_CALLS + _kimi_call("get_weather", 0, '{"city": "Paris"}')
         + _kimi_call("get_time", 1, '{"zone": "UTC"}') + KIMI_CALLS_END, content="Looking up both.",
         calls=[PARIS, UTC]),
    Case("reasoning then call", "<think>Weather for 東京.</think>" + KIMI_CALLS
         + _kimi_call("get_weather", 2, '{"city": "東京", "detail": {"wind": true}}') + KIMI_CALLS_END,
         reasoning="Weather for 東京.", calls=[TOKYO_WIND]),
    Case("malformed call", KIMI_CALLS + "<|tool_call_begin|>get weather now<|tool_call_end|>" + KIMI_CALLS_END,
         content=KIMI_CALLS + "<|tool_call_begin|>get weather now<|tool_call_end|>" + KIMI_CALLS_END),
], wrong_type=('"days": 3', '"days": "3"'))

MISTRAL = Family("mistral", "mistral", [
    Case("text", TEXT, content=TEXT),
    Case("one call", '[TOOL_CALLS]get_weather[ARGS]{"city": "São Paulo", "days": 3}', calls=[SAO_PAULO]),
    Case("parallel calls", 'On it.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]'
         '{"zone": "UTC"}', content="On it.", calls=[PARIS, UTC]),
    Case("older form, parallel calls", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
         '{"name": "get_time", "arguments": {"zone": "UTC"}}]', calls=[PARIS, UTC]),
    Case("reasoning then call", "[THINK]Weather in 東京.[/THINK]"
         '[TOOL_CALLS]get_weather[ARGS]{"city": "東京", "detail": {"wind": true}}',
         reasoning="Weather in 東京.", calls=[TOKYO_WIND]),
    Case("malformed call", "[TOOL_CALLS] sorry, no tool fits", content="[TOOL_CALLS] sorry, no tool fits"),
], wrong_type=('"days": 3', '"days": "3"'))


def _harmony_call(name: str, arguments: str, to_first: bool = False) -> str:
    if to_first:
        return f" to=functions.{name}<|channel|>commentary json<|message|>{arguments}"
    return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{arguments}"


HARMONY = Family("harmony", "harmony", [
    Case("text", "<|channel|>final<|message|>" + TEXT, content=TEXT),
    Case("analysis then final", "<|channel|>analysis<|message|>Simple greeting.<|end|><|start|>assistant"
         "<|channel|>final<|message|>Hello!", reasoning="Simple greeting.", content="Hello!"),
    Case("one call", _harmony_call("get_weather", '{"city": "São Paulo", "days": 3}'), calls=[SAO_PAULO]),
    Case("parallel calls", _harmony_call("get_weather", '{"city": "Paris"}') + "<|call|><|start|>assistant"
         + _harmony_call("get_time", '{"zone": "UTC"}', to_first=True), calls=[PARIS, UTC]),
    Case("reasoning then call", "<|channel|>analysis<|message|>Need weather for 東京.<|end|><|start|>assistant"
         + _harmony_call("get_weather", '{"city": "東京", "detail": {"wind": true}}'),
         reasoning="Need weather for 東京.", calls=[TOKYO_WIND]),
    Case("preamble then call", "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
         + _harmony_call("get_time", '{"zone": "UTC"}'), content="Checking.", calls=[UTC]),
    Case("malformed", "<|channel|>final Hello, world<|end|>", content="<|channel|>final Hello, world<|end|>"),
], wrong_type=('"days": 3', '"days": "3"'))

LLAMA3_JSON = Family("llama3_json", None, [
    Case("text", TEXT, content=TEXT),
    Case("one call", '{"name": "get_weather", "parameters": {"city": "São Paulo", "days": 3}}', calls=[SAO_PAULO]),
    Case("parallel calls", '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
         '{"name": "get_time", "parameters": {"zone": "UTC"}}', calls=[PARIS, UTC]),
    Case("after the python tag", '<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}}', calls=[UTC]),
    Case("malformed call", '{"name": get_weather, city: Paris}', content='{"name": get_weather, city: Paris}'),
], wrong_type=('"days": 3', '"days": "3"'))

FAMILIES = [QWEN3_CODER, HERMES, LLAMA3_JSON, GLM45, DEEPSEEK_V31, DEEPSEEK_V3, KIMI_K2, MISTRAL, HARMONY]
