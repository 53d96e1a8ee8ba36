"""`gearshift serve`: an OpenAI-compatible HTTP server over the engine's request loop."""
