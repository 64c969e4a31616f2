"""The test servers: ``serve_in_process`` says why a server that dies on start died."""

from __future__ import annotations

import pytest

from hypic_rag.testing.server import serve_in_process


def test_a_server_that_exits_on_start_is_an_error_with_its_output():
    with pytest.raises(RuntimeError, match="(?s)the server exited: .*--max-queue and --max-active must be >= 1"):
        with serve_in_process(["--max-queue", "0"], timeout_s=60):
            pass
