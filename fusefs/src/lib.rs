//! The sheepfs mount and its object cache (see issue "sheepfs"; not built yet).
