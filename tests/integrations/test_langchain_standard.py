"""LangChain's standard integration tests (``langchain-tests``' ``ChatModelIntegrationTests``) for ``ChatHypic`` in
process, on the bundled model: invoke, stream, batch and their async forms, usage metadata, tool calling,
structured output in every form (pydantic v2 and v1, TypedDict, JSON schema, JSON mode), unicode, histories.

What still fails is a property of the bundled 4.25M-parameter model, marked ``xfail(strict=True)`` with the
reason, so a model that learns it turns the mark into a failure to remove. What is skipped is a feature the path
does not declare: image, audio and PDF inputs (the models read text), Anthropic-format inputs, the
recorded-cassette benchmark (no HTTP to record), and over HTTP a per-call model override (the server serves one
model). ``ChatHypic`` takes ``model=`` per call: the bundled model's own directory stands for another model."""

from __future__ import annotations

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_tests.integration_tests import ChatModelIntegrationTests

from hypic_rag.integrations.langchain import ChatHypic
from hypic_rag.model.loading import default_model_path

# The bundled model copies a literal that only the question holds into an argument ("magic_function(3)" gives
# {"input": 3}, learnt from the literal_calls drills), but only in the scripts it was trained on: a customer named
# '你好啊集团' comes back as a made-up Latin name, since it never saw those bytes.
COPIES_NO_LITERAL = "the bundled model copies no literal in a script it never saw (Chinese, Japanese) into an argument"
# JSON mode constrains the answer to some JSON object, not to the keys the prompt names in words ("setup",
# "punchline"): the bundled model writes an object, but not with those keys.
NAMES_NO_KEYS = "JSON mode holds the answer to JSON; the bundled model does not take its keys from the prompt's words"


@pytest.mark.standard  # a slow tier, with every subclass (tests/server runs it over HTTP)
class BundledModelTests(ChatModelIntegrationTests):
    """What the bundled model declares and where it falls short, for every path to it (in process, over HTTP)."""

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_structured_output(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @pytest.mark.xfail(reason=COPIES_NO_LITERAL, strict=True)
    def test_unicode_tool_call_integration(self, model: BaseChatModel, **kwargs) -> None:
        super().test_unicode_tool_call_integration(model, **kwargs)

    @pytest.mark.xfail(reason=NAMES_NO_KEYS, strict=True)
    def test_json_mode(self, model: BaseChatModel) -> None:
        super().test_json_mode(model)


class TestChatHypicIntegration(BundledModelTests):
    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return ChatHypic

    @property
    def supports_model_override(self) -> bool:
        return True

    @property
    def model_override_value(self) -> str:
        return str(default_model_path())  # another model id than "hypic-default", loaded for the call

    @property
    def chat_model_params(self) -> dict:
        return {"model": "hypic-default"}

    @property
    def standard_chat_model_params(self) -> dict:
        params = super().standard_chat_model_params
        params.pop("api_key", None)  # a local model: unknown options are errors, and there is no key to give
        return params
