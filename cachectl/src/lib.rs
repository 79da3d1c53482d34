//! cachectl (see the object-cache issue; not built yet).
