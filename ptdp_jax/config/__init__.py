"""The config tree: its types (schema), loading YAML and dotted overrides (load), the checks
(validation) and every rule that resolves an `auto` value (decisions). Imports only data/ and
exits (and nothing that runs on devices)."""

from ptdp_jax.config.load import *  # noqa: F401,F403  (the public names: Config, load_config, ...)
from ptdp_jax.config.schema import ConfigError  # noqa: F401
