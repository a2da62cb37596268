"""The key that carries a message's provider fields from the transcript to the adapter.

``Message.to_openai(provider=True)`` puts the message's ``extra`` (signed thinking
blocks, reasoning items, ...) under it; each adapter dialect takes it off again and
sends back what its API can express. Its own module so the adapter can name it
without importing the transcript model.
"""

PROVIDER_FIELDS = "provider_fields"
