#!/usr/bin/env python3
"""Writes tests/golden/chat_golden.json: chat templates rendered by real jinja2, the independent
reference for qevict's Jinja2-subset interpreter (tests/chat/chat_template_test.cpp).

    python=$(tools/venv.sh)   # or /root/.cache/qevict/venv/bin/python (has jinja2)
    $python tools/golden/make_chat_golden.py [--model SmolLM2-135M-Instruct.Q4_1.gguf] \
        --out tests/golden/chat_golden.json

jinja2 is configured exactly as Hugging Face transformers' apply_chat_template configures it
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its own tojson and
raise_exception) and gets the same variables: messages, add_generation_prompt, bos_token,
eos_token, tools=None, documents=None.

Templates: SmolLM2's exactly as the model ships it (--model checks that it still matches the
GGUF's tokenizer.chat_template, read with llama-cpp-python), ChatML, Llama-3, a Llama-3.1
style one, Qwen2.5, Mistral [INST] v0.1 and v0.3 style, Zephyr, Gemma (the public templates,
written out by hand), and small feature templates that exercise each part of the subset.
Each is rendered over several conversations, with and without add_generation_prompt; when
jinja2 raises, the case records the error instead (raise_exception's message verbatim).
"""

import argparse
import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# --- templates ------------------------------------------------------------------------------

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

LLAMA31 = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

MISTRAL_V01 = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}"
)

MISTRAL_V03 = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {{- "[/AVAILABLE_TOOLS]" }}
        {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>
' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>
'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
    "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

# Feature templates: one part of the subset each, rendered over one conversation.
FEATURES = {
    "loop_vars": (
        "{% for m in messages %}{{ loop.index }}/{{ loop.length }} i0={{ loop.index0 }} "
        "first={{ loop.first }} last={{ loop.last }} rev={{ loop.revindex }},{{ loop.revindex0 }}"
        "{% if loop.previtem is defined %} prev={{ loop.previtem.role }}{% endif %}"
        "{% if loop.nextitem is defined %} next={{ loop.nextitem.role }}{% endif %}\n{% endfor %}"
    ),
    "whitespace": (
        "  {% if true %}\n    indented {{ 'x' }}\n  {% endif %}\n"
        "a   {%- if true -%}   b   {%- endif -%}   c\n"
        "{{- '  d  ' -}}  e  {{ 'f' }}  \n"
        "  {%+ if true %}kept-indent{% endif %}\n"
        "{% if true +%}\nkept-newline{% endif %}\n"
        "{# a comment #}\n"
        "  {#- stripped comment -#}  \n"
        "x {% if true %}inline{% endif %} y\n"
        "{% for m in messages %}\n  - {{ m.role }}\n{% endfor %}\n"
        "{{ 'last' }}\n"
    ),
    "scoping": (
        "{% set x = 'outer' %}{% for m in messages %}[{{ x }}]{% set x = m.role %}[{{ x }}]"
        "{% endfor %}after={{ x }} "
        "{% if true %}{% set y = 'set-in-if' %}{% endif %}{{ y }} "
        "{% set ns = namespace(count=0, roles='') %}{% for m in messages %}"
        "{% set ns.count = ns.count + 1 %}{% set ns.roles = ns.roles ~ m.role[0] %}{% endfor %}"
        "{{ ns.count }} {{ ns.roles }} {{ inner is defined }}"
    ),
    "filters": (
        "{{ '  a b  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ messages | length }}|"
        "{{ messages[0].content | length }}|{{ 'MiXeD' | upper }}|{{ 'MiXeD' | lower }}|"
        "{{ 'hello wORLD' | capitalize }}|{{ missing | default('dflt') }}|"
        "{{ '' | default('empty', true) }}|{{ none | default('not-used') }}|"
        "{{ missing | d('d-alias') }}|{{ 'it\\'s \"q\" <b>&\\n\\t\\\\ é' | tojson }}|"
        "{{ messages[0] | tojson }}|{{ [1, 2.5, true, none, 'x'] | tojson }}|"
        "{{ [3, 1, 2] | first }}{{ 'abc' | last }}|{{ ['a', 'b', 'c'] | join('-') }}|"
        "{{ [1, 2] | join }}|{{ 'a-b-c' | replace('-', '+') }}|{{ 42 | string }}|"
        "{{ '12' | int + 1 }}|{{ 'x' | int }}|{{ '2.5' | float }}|{{ -3 | abs }}|"
        "{{ 'ab' | list }}|{{ messages | map(attribute='role') | join(',') }}|"
        "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|"
        "{{ messages | rejectattr('role', 'equalto', 'user') | map(attribute='role') | join }}|"
        "{{ [1, 2, 3, 4] | select('even') | list }}|{{ [1, 2, 3, 4] | reject('odd') | list }}|"
        "{{ ['a', 'B'] | map('upper') | join }}|{% for k, v in {'x': 1, 'y': 2} | items %}"
        "{{ k }}={{ v }};{% endfor %}|{{ 'abc' | count }}"
    ),
    "string_methods": (
        "{{ '  pad  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  l'.lstrip() }}|{{ 'r  '.rstrip() }}|"
        "{{ 'prefix-body'.startswith('prefix') }}|{{ 'body'.startswith(('x', 'b')) }}|"
        "{{ 'file.txt'.endswith('.txt') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|"
        "{{ 'a b c'.split(' ', 1) }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'Ab'.upper() }}"
        "{{ 'Ab'.lower() }}|{{ 'hello big world'.title() }}|{{ 'hELLO'.capitalize() }}|"
        "{{ messages[0].get('role') }}|{{ messages[0].get('nope', 'fallback') }}|"
        "{{ messages[0].get('nope') }}|{{ messages[0].keys() | list }}|"
        "{% for k, v in messages[0].items() %}{{ k }}:{{ v | length }};{% endfor %}"
    ),
    "operators": (
        "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} "
        "{{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ 7.5 % 2 }} {{ 0.1 + 0.2 }} "
        "{{ 1e20 }} {{ 1 / 3 }} {{ 2.0 }} {{ 1e-5 }} {{ -0.0 }} {{ 10 - 3 - 2 }} "
        "{{ 'a' ~ 1 ~ none ~ true ~ 2.5 }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [1] * 2 }} "
        "{{ 'ab' + 'cd' }} {{ [1] + [2] }} {{ true + 1 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} "
        "{{ 2 < 3 }} {{ 'abc' < 'abd' }} {{ [1, 2] < [1, 3] }} {{ 3 >= 3 }} {{ 'b' in 'abc' }} "
        "{{ 'z' not in 'abc' }} {{ 2 in [1, 2] }} {{ 'role' in messages[0] }} "
        "{{ 1 and 'yes' }} {{ 0 and 'no' }}|{{ '' or 'fallback' }} {{ not none }} "
        "{{ not 1 == 2 }} {{ 'T' if messages else 'F' }} {{ 'a' if false else 'b' if true else 'c' }}"
        "|{{ 'x' if false }}| {{ -(3) }} {{ - 2 + 5 }} {{ 2 * -3 }} {{ (1, 'two') }} {{ (1,) }} "
        "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 == true }} {{ 'a' in 'abc' in ['abc'] }}"
    ),
    "access": (
        "{{ messages[0]['role'] }} {{ messages[0].role }} {{ messages[-1].content }} "
        "{{ messages[1:] | length }} {{ messages[:1] | map(attribute='role') | join }} "
        "{{ messages[::-1] | map(attribute='role') | join(',') }} {{ 'abcdef'[1:4] }} "
        "{{ 'abcdef'[::2] }} {{ 'abcdef'[-2:] }} {{ 'hé!'[1] }} {{ [1, 2, 3][-1] }}|"
        "{{ messages[99] }}|{{ messages[0].nope }}|{{ none.attr }}|{{ 'str'.attr }}|"
        "{{ {'a': {'b': 'nested'}}['a']['b'] }} {{ {'k': 1}.k }}"
    ),
    "tests": (
        "{{ x is defined }} {{ x is undefined }} {{ messages is defined }} {{ none is none }} "
        "{{ 1 is none }} {{ 'a' is string }} {{ 1 is string }} {{ 1 is number }} {{ 1.5 is number }} "
        "{{ 1 is integer }} {{ true is integer }} {{ 1.5 is float }} {{ true is boolean }} "
        "{{ messages[0] is mapping }} {{ messages is sequence }} {{ 'ab' is iterable }} "
        "{{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby(3) }} {{ 1 is eq(1) }} "
        "{{ 'a' is ne('b') }} {{ 'a' is in('abc') }} {{ true is true }} {{ 0 is false }} "
        "{{ x is not defined }} {{ 1 is not none }} {{ tools is none }} {{ documents is defined }} "
        "{{ 9 is divisibleby 3 }} {{ 2.0 is even }} {{ 'a' is eq 'a' }} {{ false | map('upper') | list }} "
        "{{ 0.5 is odd }} {{ 0.5 is even }} {{ -3 is odd }} {{ 3.0 is odd }} {{ {'a': 1} | items | list }}"
    ),
    "literals": (
        "{{ 'single' }} {{ \"double\" }} {{ 'esc\\'aped' }} {{ \"tab\\tnl\\nbs\\\\\" }} "
        "{{ '\\u00e9\\x41\\U0001F600' }} {{ 'adj' 'acent' }} {{ [1, 'two', none, true, false] }} "
        "{{ {'k': 'v', 'n': 1} }} {{ True }} {{ False }} {{ None }} {{ 70 }} {{ 1.50 }} "
        "{{ ['it\\'s', 'a\"b', 'x\\ny'] }} {{ [] }} {{ {} }} {{ () }} {{ ns }}"
        "{% set ns = namespace(a=1) %} {{ ns }}"
    ),
    "control": (
        "{% for m in messages if m.role != 'system' %}{{ loop.index }}:{{ m.role }} {% endfor %}|"
        "{% for m in [] %}never{% else %}empty-else{% endfor %}|"
        "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}"
        "{% endif %}{{ i }}{% endfor %}|{% for i in range(1, 10, 3) %}{{ i }}{% endfor %}|"
        "{% for a, b in [['x', 1], ['y', 2]] %}{{ a }}{{ b }}{% endfor %}|"
        "{% for c in 'hé' %}[{{ c }}]{% endfor %}|{% for k in {'p': 1, 'q': 2} %}{{ k }}{% endfor %}|"
        "{% for m in messages %}{% for n in messages %}{% if loop.index == 2 %}{% break %}{% endif %}"
        "{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}|"
        "{% if messages | length > 3 %}many{% elif messages | length > 1 %}some{% else %}one{% endif %}"
        "|{% generation %}gen{% endgeneration %}|{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}"
    ),
}

# Templates that are expected to fail in jinja2 too (wrong use of values, at render time).
FAILING = {
    "raise_custom": "{% if messages | length > 1 %}{{ raise_exception('Too many: ' ~ messages | length) }}{% endif %}ok",
    "undefined_attr": "{{ nothing.attr }}",
    "undefined_plus": "{{ nothing + 1 }}",
    "int_plus_str": "{{ 1 + 'a' }}",
    "compare_types": "{{ 'a' < 1 }}",
    "div_zero": "{{ 1 / 0 }}",
    "iterate_int": "{% for x in 3 %}{% endfor %}",
}

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi_turn": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "system_multi_turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another?"},
    ],
    "tricky": [
        {
            "role": "user",
            "content": "  spaced  \n\tcontent with 'quotes', \"dq\", {{ braces }}, {% tag %}, "
            "unicode \u00e9 \u4e16\u754c \U0001F44B, backslash \\ end \n",
        },
    ],
    "assistant_first": [
        {"role": "assistant", "content": "I start."},
        {"role": "user", "content": "ok"},
    ],
    "two_users": [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
    ],
}

TOKENS = {
    "smollm2": ("<|im_start|>", "<|im_end|>"),
    "chatml": ("", "<|im_end|>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "llama31": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen25": ("", "<|im_end|>"),
    "mistral_v01": ("<s>", "</s>"),
    "mistral_v03": ("<s>", "</s>"),
    "zephyr": ("<s>", "</s>"),
    "gemma": ("<bos>", "<eos>"),
}

MODEL_TEMPLATES = {
    "smollm2": SMOLLM2,
    "chatml": CHATML,
    "llama3": LLAMA3,
    "llama31": LLAMA31,
    "qwen25": QWEN25,
    "mistral_v01": MISTRAL_V01,
    "mistral_v03": MISTRAL_V03,
    "zephyr": ZEPHYR,
    "gemma": GEMMA,
}


# --- the Hugging Face environment --------------------------------------------------------

class RaisedByTemplate(Exception):
    pass


def make_env():
    # As transformers.utils.chat_template_utils._compile_jinja_template (minus the
    # AssistantTracker extension, whose {% generation %} tag renders its body unchanged).
    def raise_exception(message):
        raise RaisedByTemplate(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    class GenerationTag(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def render(env, template, messages, add_generation_prompt, bos, eos):
    t = env.from_string(template)
    return t.render(messages=messages, tools=None, documents=None,
                    add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos)


def case(env, name, template_name, template, conv, agp, bos, eos):
    c = {"name": name, "template": template_name, "conversation": conv,
         "add_generation_prompt": agp, "bos_token": bos, "eos_token": eos}
    try:
        c["expected"] = render(env, template, CONVERSATIONS[conv], agp, bos, eos)
    except RaisedByTemplate as e:
        c["error"] = "raise_exception: " + str(e)
    except jinja2.TemplateError as e:  # UndefinedError and friends
        c["error_kind"] = type(e).__name__
        c["error"] = str(e)
    except (TypeError, ZeroDivisionError, ValueError) as e:
        c["error_kind"] = type(e).__name__
        c["error"] = str(e)
    return c


def check_model(path):
    from llama_cpp import Llama

    m = Llama(model_path=path, vocab_only=True, verbose=False)
    shipped = m.metadata["tokenizer.chat_template"]
    if shipped != SMOLLM2:
        sys.exit(f"{path}: tokenizer.chat_template differs from SMOLLM2 in this script:\n{shipped!r}")
    print(f"{path}: SmolLM2 template matches", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="SmolLM2 GGUF whose chat template must equal SMOLLM2")
    ap.add_argument("--out", default="tests/golden/chat_golden.json")
    args = ap.parse_args()
    if args.model:
        check_model(args.model)

    env = make_env()
    templates = dict(MODEL_TEMPLATES)
    cases = []
    for tname, text in MODEL_TEMPLATES.items():
        bos, eos = TOKENS[tname]
        for conv in CONVERSATIONS:
            for agp in (False, True):
                cases.append(case(env, f"{tname}/{conv}/{'gen' if agp else 'nogen'}", tname, text,
                                  conv, agp, bos, eos))
    for fname, text in FEATURES.items():
        templates["feature_" + fname] = text
        cases.append(case(env, "feature/" + fname, "feature_" + fname, text, "system_multi_turn",
                          True, "<s>", "</s>"))
    for fname, text in FAILING.items():
        templates["failing_" + fname] = text
        cases.append(case(env, "failing/" + fname, "failing_" + fname, text, "multi_turn", False,
                          "", ""))
        if "error" not in cases[-1]:
            sys.exit(f"failing/{fname} rendered without error")
    for c in cases:
        if c["template"].startswith("feature_") and "error" in c:
            sys.exit(f"{c['name']}: {c['error']}")

    out = {
        "generator": "tools/golden/make_chat_golden.py",
        "jinja2_version": jinja2.__version__,
        "templates": templates,
        "conversations": CONVERSATIONS,
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    n_err = sum("error" in c for c in cases)
    print(f"wrote {args.out}: {len(cases)} cases ({n_err} errors)", file=sys.stderr)


if __name__ == "__main__":
    main()
