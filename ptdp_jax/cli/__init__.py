"""The commands (console scripts): argument parsing, messages and exit codes around the
library; nothing else imports them."""
