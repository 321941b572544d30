"""Small building blocks shared by the draft model and the engine's target runtime."""
