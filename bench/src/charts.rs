//! Charts with plotters (to be written).
