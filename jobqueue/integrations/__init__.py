"""Middleware for third-party tools, each an optional extra: ``sentry`` (sentry-sdk) and
``otel`` (opentelemetry-api). Import the module you use; this package imports neither."""
