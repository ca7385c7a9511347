// The catalog's schema: its version and migrations (meta/schema.cc).
// Internal to meta/sqlite_catalog*.cc.
#pragma once

#include "meta/sqlite_db.h"

namespace gpufs::catalog_internal {

// Applies the migrations the database lacks, each in its own transaction
// (which also re-reads user_version, should another process migrate first).
// EPROTO when the database is newer than this code.
Status Migrate(Db& db);

}  // namespace gpufs::catalog_internal
