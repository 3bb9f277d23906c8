"""What a run is made of: the config schema (pydantic), the preset catalog, the shipped presets
and bench suites. Imported by every layer; imports only the algorithm registries."""
