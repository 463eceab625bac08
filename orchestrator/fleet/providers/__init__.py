"""Providers that rent and destroy the machines a sweep runs on (static: nodes the operator registered;
cloud providers through their official SDKs). Each exposes the same few functions; the sweep runner never
knows which one it talks to."""
