"""End-to-end recipes that chain the library's stages (the quickstart)."""
