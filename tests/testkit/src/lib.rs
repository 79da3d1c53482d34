//! Process harness for end-to-end tests.
