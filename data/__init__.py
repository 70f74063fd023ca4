"""The companion's data, installed as the package `helpers.data` (see `helpers.paths`)."""
