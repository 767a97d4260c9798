//! The writer's SQL for the exporters' bookmarks (`export_cursors`): how far each has sent the
//! journal, and its last error. Not journaled: a bookmark grants nothing and proves nothing.

use super::*;

impl Writer {
    /// `name` has sent every row up to `seq` to `target`; its last error is cleared.
    pub(crate) fn export_progress(
        &mut self,
        name: &str,
        target: &str,
        seq: u64,
        at: Timestamp,
    ) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO export_cursors (name, target, seq, updated_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (name) DO UPDATE SET target = ?2, seq = max(seq, ?3), updated_at = ?4,
                                                  last_error = NULL, error_at = NULL",
            )?
            .execute(params![name, target, i64::try_from(seq).unwrap_or(i64::MAX), at.as_millis()])?;
        Ok(())
    }

    /// `name` could not send to `target`: `error` is kept (its bookmark stays where it was, or
    /// starts at `from` for an exporter that never sent anything).
    pub(crate) fn export_failed(
        &mut self,
        name: &str,
        target: &str,
        from: u64,
        error: &str,
        at: Timestamp,
    ) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO export_cursors (name, target, seq, updated_at, last_error, error_at)
                 VALUES (?1, ?2, ?3, ?5, ?4, ?5)
                 ON CONFLICT (name) DO UPDATE SET target = ?2, last_error = ?4, error_at = ?5",
            )?
            .execute(params![name, target, i64::try_from(from).unwrap_or(i64::MAX), error, at.as_millis()])?;
        Ok(())
    }
}
