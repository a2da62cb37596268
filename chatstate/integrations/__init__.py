"""chatstate as the memory of other frameworks.

- ``chatstate.integrations.agents.ChatstateSession``: the OpenAI Agents SDK's Session
  (``pip install 'chatstate[agents]'``).
- ``chatstate.integrations.langchain.ChatstateChatMessageHistory``: LangChain's
  ``BaseChatMessageHistory`` (``pip install 'chatstate[langchain]'``).

Importing this package imports neither framework; each submodule imports its own.
"""
