//! The headroom rule on CUDA ([`crate::Backend::allot_workspace`]): a cuDNN conv pass whose
//! step has bytes free below its peak while the pass runs is searched again within that much
//! more workspace, so a faster algorithm runs where it costs no peak (issue 12: "workspace
//! that costs no peak").

use super::CudaBackend;
use super::conv::layout;
use crate::backend::least_headroom;
use crate::{Conv2dGeometry, ConvPass, DType, OpDesc, TensorError};
use std::collections::HashMap;
use std::sync::Mutex;

/// A cuDNN conv pass as its choice is keyed (with the backend's precision): a pass of one
/// geometry in one dtype, with or without a bias.
pub(super) type ConvKey = (Conv2dGeometry, DType, ConvPass);

/// The passes an allotment claimed ([`crate::Backend::workspace_allotted`]), each with the
/// workspace limit its search takes (bytes; at least the backend's limit).
pub(super) type Allowances = Mutex<HashMap<ConvKey, usize>>;

impl CudaBackend {
    /// The workspace limit the search of `key` takes: its allowance where it is claimed, else
    /// the backend's limit.
    pub(super) fn conv_limit(&self, key: &ConvKey) -> usize {
        let allowances = self.allowances.lock().unwrap_or_else(|p| p.into_inner());
        allowances.get(key).copied().unwrap_or(self.workspace_limit)
    }

    /// The key of `op` if it is a convolution pass.
    fn conv_key(op: &OpDesc) -> Option<ConvKey> {
        match *op {
            OpDesc::Conv {
                geometry,
                pass,
                dtype,
                ..
            } => Some((geometry, dtype, pass)),
            _ => None,
        }
    }

    /// See [`crate::Backend::allot_workspace`]: every op's schedule first (so a bad op fails
    /// before anything changes), then the least headroom per searched pass, each pass widened
    /// by it; returns how many entries of `headroom` changed schedule.
    pub(super) fn allot(&self, headroom: &[(OpDesc, usize)]) -> Result<usize, TensorError> {
        let schedules = || {
            headroom
                .iter()
                .map(|(op, _)| self.op_workspace_schedule(op))
                .collect::<Result<Vec<_>, _>>()
        };
        let before = schedules()?;
        let searched = |op: &OpDesc| {
            Self::conv_key(op).filter(|(g, dtype, pass)| self.conv_is_searched(g, *dtype, *pass))
        };
        for (key, bytes) in least_headroom(headroom, searched) {
            self.widen(key, bytes)?;
        }
        let after = schedules()?;
        Ok(before.iter().zip(&after).filter(|(b, a)| b != a).count())
    }

    /// See [`crate::Backend::workspace_allotted`].
    pub(super) fn allotted(&self, op: &OpDesc) -> bool {
        let allowances = self.allowances.lock().unwrap_or_else(|p| p.into_inner());
        Self::conv_key(op).is_some_and(|key| allowances.contains_key(&key))
    }

    /// See [`crate::Backend::revoke_workspace`]: each claimed pass of `ops` back to the
    /// backend's limit (searched again where it was widened), still claimed.
    pub(super) fn revoke(&self, ops: &[OpDesc]) -> Result<(), TensorError> {
        for (g, dtype, pass) in ops.iter().filter_map(Self::conv_key) {
            let widened = {
                let mut allowances = self.allowances.lock().unwrap_or_else(|p| p.into_inner());
                let base = self.workspace_limit;
                allowances
                    .get_mut(&(g, dtype, pass))
                    .is_some_and(|limit| std::mem::replace(limit, base) > base)
            };
            if widened {
                self.dnn.forget((&g, dtype), self.precision, pass);
                self.calibrate_conv((&g, dtype, pass), true)?;
            }
        }
        Ok(())
    }

    /// Claims `key` and searches it again within its chosen workspace plus `headroom` bytes
    /// (at most the user's limit), if cuDNN lists a candidate the old limit left out; a search
    /// that runs out of memory for its larger scratch searches within the old limit again.
    fn widen(&self, key: ConvKey, headroom: usize) -> Result<(), TensorError> {
        let (g, dtype, pass) = key;
        self.calibrate_conv((&g, dtype, pass), true)?;
        let Some((now, _)) = self.dnn.chosen((&g, dtype), self.precision, pass) else {
            return Ok(());
        };
        let (old, limit) = (self.conv_limit(&key), now.saturating_add(headroom));
        let limit = limit.min(self.workspace_cap);
        let (conv, _) = layout(&g, dtype);
        let bound = |l| self.dnn.bound(pass, &conv, self.precision, l);
        if limit <= old || bound(limit)? == bound(old)? {
            self.set_allowance(key, old);
            return Ok(());
        }
        self.set_allowance(key, limit);
        self.dnn.forget((&g, dtype), self.precision, pass);
        match self.calibrate_conv((&g, dtype, pass), true) {
            Err(e) if e.oom().is_some() => {
                self.set_allowance(key, old);
                self.calibrate_conv((&g, dtype, pass), true)
            }
            done => done,
        }
    }

    fn set_allowance(&self, key: ConvKey, limit: usize) {
        let mut allowances = self.allowances.lock().unwrap_or_else(|p| p.into_inner());
        allowances.insert(key, limit);
    }
}
