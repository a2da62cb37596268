"""The clients that send what a dialect encoded: ``wire`` (httpx2, the default) and
``sdk`` (a caller's ``openai.OpenAI``). Each module loads its HTTP library, so this
package imports none of them."""
