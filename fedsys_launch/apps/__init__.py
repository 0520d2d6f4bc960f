"""The Flower apps: the fedsys ServerApp with its experiment runner, the ClientApp's
handlers and what they use (run-config admission, the model on a node, attack injection),
where a strategy starts (afresh, resumed, branched) and the trackers of its rounds."""
