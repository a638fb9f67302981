"""The web page at `/`: a playground to talk to the model, the engine's live view and batch jobs,
served from static files shipped in the package, with the few routes only the page needs."""
