"""Arbor's own providers as litellm custom providers, registered when litellm is first loaded (issue 34).

The seam calls an own provider directly; this adapter lets litellm call it too (`litellm.completion(
model="arbor/echo", ...)`, streamed or not, and `litellm.embedding(model="arbor/echo-embed", ...)`), with the
same chunks, so either way reads the same answer. Imported only with litellm: it imports litellm at its top.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from litellm import CustomLLM
from litellm.types.utils import EmbeddingResponse, Message, ModelResponse, Usage

from conversations.llm import OwnProvider, estimate_tokens


class OwnProviderLLM(CustomLLM):
    """litellm's view of an `OwnProvider`: its chunks streamed as they are, or joined into one answer."""

    def __init__(self, name: str, provider: OwnProvider):
        super().__init__()
        self.name = name
        self.provider = provider

    def streaming(self, model, messages, api_base, custom_prompt_dict, model_response, *args, **kwargs):
        options = kwargs.get("optional_params") or {}
        return self.provider.stream(model, messages, tools=options.get("tools"),
                                    compaction=bool(options.get("arbor_compaction")))

    def completion(self, model, messages, api_base, custom_prompt_dict, model_response, *args, **kwargs):
        text: list[str] = []
        calls: list[dict[str, Any]] = []
        usage: dict[str, int] = {}
        for chunk in self.streaming(model, messages, api_base, custom_prompt_dict, model_response, *args, **kwargs):
            text.append(chunk.get("text") or "")
            if chunk.get("tool_use"):
                call = chunk["tool_use"]
                calls.append({"id": call["id"], "type": "function", "function": dict(call["function"])})
            usage = chunk.get("usage") or usage
        response = ModelResponse(model=f"{self.name}/{model}")
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
        if calls:
            message["tool_calls"] = calls
        response.choices[0].message = Message(**message)
        response.choices[0].finish_reason = "tool_calls" if calls else "stop"
        response.usage = Usage(**usage) if usage else Usage(prompt_tokens=0, completion_tokens=0, total_tokens=0)
        return response

    async def acompletion(self, *args, **kwargs):
        return self.completion(*args, **kwargs)

    async def astreaming(self, *args, **kwargs):
        for chunk in self.streaming(*args, **kwargs):
            yield chunk

    def embedding(self, model, input, model_response: EmbeddingResponse, *args, **kwargs):
        texts = [input] if isinstance(input, str) else [str(text) for text in input]
        model_response.model = f"{self.name}/{model}"
        model_response.data = [{"object": "embedding", "index": n, "embedding": vector}
                               for n, vector in enumerate(self.provider.embed(model, texts))]
        tokens = sum(estimate_tokens([{"text": text}]) for text in texts)
        model_response.usage = Usage(prompt_tokens=tokens, completion_tokens=0, total_tokens=tokens)
        return model_response

    async def aembedding(self, *args, **kwargs):
        return self.embedding(*args, **kwargs)


def register(litellm: ModuleType, name: str, provider: OwnProvider) -> None:
    """Make `name/<model>` a litellm custom provider answered by `provider`; registering again replaces it."""
    litellm.custom_provider_map = [
        *[p for p in litellm.custom_provider_map if p.get("provider") != name],
        {"provider": name, "custom_handler": OwnProviderLLM(name, provider)},
    ]
    litellm.utils.custom_llm_setup()
