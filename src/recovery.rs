//! The recovery procedure, in one place.
