"""LangChain's standard integration tests for ``ChatOpenAI`` pointed at ``hypic-rag serve`` on the bundled model:
what an unmodified LangChain user gets over HTTP. The failures that remain are the bundled model's, the same as
``ChatHypic``'s in process (``tests/integrations/test_langchain_standard.py``), marked there and here alike."""

from __future__ import annotations

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI

from tests.integrations.test_langchain_standard import BundledModelTests

from .conftest import MODEL


class TestChatOpenAIOverTheServer(BundledModelTests):
    url = ""

    @pytest.fixture(autouse=True)
    def _served(self, server: str) -> None:
        type(self).url = server

    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return ChatOpenAI

    @property
    def chat_model_params(self) -> dict:
        return {"model": MODEL, "base_url": self.url + "/v1", "api_key": "unused", "stream_usage": True}
