//! Verbs of the `ctl.delivery` rail (agent-callable): `durableJoin {channel, lifecycleUid?}`,
//! `durableLeave {channel, generation, lifecycleUid?}`, `listMemberships {lifecycleUid?}` (the
//! membership transactions of `plane::durable`) and the anycast sender verbs. The rail parsed
//! the request (`wire::DeliveryRequest`); each verb here only calls its operation and names
//! the reply's shape.

use crate::plane::{durable_join, durable_leave, list_memberships, Fences, PlaneCtx};
use crate::rails::anycast;
use crate::wire::{DeliveryRequest, Principal, Refusal, ReplyData};

/// Runs one `ctl.delivery` request.
pub async fn delivery(
    ctx: &PlaneCtx,
    fences: &Fences,
    caller: &Principal,
    request: DeliveryRequest,
) -> Result<ReplyData, Refusal> {
    match request {
        DeliveryRequest::DurableJoin(args) => durable_join(ctx, fences, caller, &args)
            .await
            .map(ReplyData::Joined),
        DeliveryRequest::DurableLeave(args) => durable_leave(ctx, fences, caller, &args)
            .await
            .map(ReplyData::Left),
        DeliveryRequest::ListMemberships(args) => list_memberships(ctx, caller, &args)
            .await
            .map(ReplyData::Memberships),
        DeliveryRequest::AnycastStatus(args) => anycast::status(ctx, caller, args)
            .await
            .map(ReplyData::AnycastStatus),
        DeliveryRequest::AnycastCancel(args) => anycast::cancel(ctx, caller, args)
            .await
            .map(ReplyData::AnycastCancelled),
    }
}
