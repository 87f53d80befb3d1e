"""The application: the CLI, the nightly steps, the factories that build what a config names."""
