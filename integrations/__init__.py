"""LangChain, LlamaIndex and agent-loop integrations, installed as ``hypic_rag.integrations``."""
