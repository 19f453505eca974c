//! poolgate
