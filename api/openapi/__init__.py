"""The OpenAPI 3.1 document (GET /openapi.json) and the request declarations it is built from."""
