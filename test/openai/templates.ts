/**
 * Chat templates of models with other tool-call formats, as their tokenizer_config.json files
 * write calls (shortened where nothing about calls changes): Qwen3-Coder's XML calls, Llama
 * 3.1's JSON calls with "parameters", Mistral's `[TOOL_CALLS]` arrays (v3 tokenizer, call ids
 * of 9 characters). Hermes-style templates are in `../hf/fixtures.ts` (`chatmlToolsTemplate`)
 * and `../hf/qwen-fixtures.ts` (Qwen2.5, Qwen3).
 */

/** Qwen3-Coder-Instruct's template: tools as <function> blocks, calls as <function=...><parameter=...>. */
export const qwen3CoderTemplate = [
  "{%- if messages[0].role == 'system' %}{%- set system_message = messages[0].content %}{%- set loop_messages = messages[1:] %}",
  "{%- else %}{%- set system_message = 'You are a helpful assistant.' %}{%- set loop_messages = messages %}{%- endif %}",
  "{{- '<|im_start|>system\\n' + system_message }}",
  "{%- if tools %}{{- '\\n\\n# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' }}",
  "{%- for tool in tools %}{%- set tool = tool.function %}{{- '\\n<function>\\n<name>' + tool.name + '</name>' }}{{- '\\n<description>' + (tool.description or '') + '</description>' }}{{- '\\n</function>' }}{%- endfor %}",
  "{{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:\\n\\n<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n</function>\\n</tool_call>' }}{%- endif %}",
  "{{- '<|im_end|>\\n' }}",
  "{%- for message in loop_messages %}",
  "{%- if message.role == 'assistant' and message.tool_calls is defined and message.tool_calls is iterable and message.tool_calls | length > 0 %}",
  "{{- '<|im_start|>' + message.role }}{%- if message.content is defined and message.content is string and message.content | trim | length > 0 %}{{- '\\n' + message.content | trim + '\\n' }}{%- endif %}",
  "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}",
  "{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}",
  "{%- if tool_call.arguments is defined %}{%- for args_name, args_value in tool_call.arguments|items %}",
  "{{- '<parameter=' + args_name + '>\\n' }}",
  "{%- if args_value is mapping or (args_value is iterable and args_value is not string) %}{{- args_value | tojson }}{%- else %}{{- args_value | string }}{%- endif %}",
  "{{- '\\n</parameter>\\n' }}{%- endfor %}{%- endif %}",
  "{{- '</function>\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}",
  "{%- elif message.role == 'user' or message.role == 'system' or message.role == 'assistant' %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}",
  "{%- elif message.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}",
  "{%- endif %}{%- endfor %}",
  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
].join("")

/** Llama 3.1-Instruct's template: tools in the first user message, one call per turn as JSON with "parameters". */
export const llama31Template = [
  "{{- bos_token }}",
  "{%- if messages[0].role == 'system' %}{%- set system_message = messages[0].content | trim %}{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}",
  "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}{%- if tools %}{{- 'Environment: ipython\\n' }}{%- endif %}{{- system_message + '<|eot_id|>' }}",
  "{%- if tools and messages | length > 0 %}{%- set first_user_message = messages[0].content | trim %}{%- set messages = messages[1:] %}",
  "{{- '<|start_header_id|>user<|end_header_id|>\\n\\nGiven the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\\n\\n' }}",
  "{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}. Do not use variables.\\n\\n' }}",
  "{%- for t in tools %}{{- t | tojson }}{{- '\\n\\n' }}{%- endfor %}{{- first_user_message + '<|eot_id|>' }}{%- endif %}",
  "{%- for message in messages %}",
  "{%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}",
  "{%- elif 'tool_calls' in message %}{%- if not message.tool_calls | length == 1 %}{{- raise_exception('This model only supports single tool-calls at once!') }}{%- endif %}",
  "{%- set tool_call = message.tool_calls[0].function %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}",
  "{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}{{- tool_call.arguments | tojson }}{{- '}' }}{{- '<|eot_id|>' }}",
  "{%- elif message.role == 'tool' or message.role == 'ipython' %}{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' }}{{- message.content }}{{- '<|eot_id|>' }}",
  "{%- endif %}{%- endfor %}",
  "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
].join("")

/** Mistral-7B-Instruct-v0.3's template: [AVAILABLE_TOOLS] before the last user message, calls as a [TOOL_CALLS] array with 9-character ids. */
export const mistralTemplate = [
  "{%- set user_messages = messages | selectattr('role', 'equalto', 'user') | list %}",
  "{{- bos_token }}",
  "{%- for message in messages %}",
  "{%- if message.role == 'user' %}",
  "{%- if tools and (message == user_messages[-1]) %}{{- '[AVAILABLE_TOOLS] [' }}",
  "{%- for tool in tools %}{{- tool | tojson }}{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}{{- '][/AVAILABLE_TOOLS]' }}{%- endif %}",
  "{{- '[INST] ' + message.content + '[/INST]' }}",
  "{%- elif message.tool_calls is defined and message.tool_calls is not none %}{{- '[TOOL_CALLS] [' }}",
  "{%- for tool_call in message.tool_calls %}{%- set out = tool_call.function | tojson %}{{- out[:-1] }}",
  "{%- if not tool_call.id is defined or tool_call.id | length != 9 %}{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}",
  "{{- ', \"id\": \"' + tool_call.id + '\"}' }}{%- if not loop.last %}{{- ', ' }}{%- else %}{{- ']' + eos_token }}{%- endif %}{%- endfor %}",
  "{%- elif message.role == 'assistant' %}{{- ' ' + message.content | trim + eos_token }}",
  "{%- elif message.role == 'tool' %}{{- '[TOOL_RESULTS] {\"content\": ' + message.content | tojson + ', \"call_id\": \"' + message.tool_call_id + '\"}[/TOOL_RESULTS]' }}",
  "{%- endif %}{%- endfor %}"
].join("")
