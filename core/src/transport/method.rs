//! The protocol's methods as one typed list, and who may reach each one from which door.
//!
//! Every transport asks this table, so a method cannot be reachable by relays on one host
//! and not on another.

/// A method of protocol.md §4, or of the operator's API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// `session.open`
    SessionOpen,
    /// `account.register`
    AccountRegister,
    /// `account.update`
    AccountUpdate,
    /// `device.register`
    DeviceRegister,
    /// `device.revoke`
    DeviceRevoke,
    /// `device.list`
    DeviceList,
    /// `route.get`
    RouteGet,
    /// `route.publish`
    RoutePublish,
    /// `contact.revoke`
    ContactRevoke,
    /// `message.send`
    MessageSend,
    /// `message.deliver`
    MessageDeliver,
    /// `message.deliver.batch`: relay RPC in batches, each item a `message.deliver`.
    MessageDeliverBatch,
    /// `message.delivery.status`
    DeliveryStatus,
    /// `message.timeline.sync`
    TimelineSync,
    /// `admin.deliveries`: the operator's view of deliveries in flight.
    AdminDeliveries,
    /// `admin.destinations`: the operator's view of each destination's health and queue.
    AdminDestinations,
    /// `admin.destination.retry`: every waiting delivery to a destination due now.
    AdminDestinationRetry,
    /// `admin.delivery.retry`: one waiting delivery due now.
    AdminDeliveryRetry,
    /// `admin.destination.pause`: no attempt to a destination until resumed.
    AdminDestinationPause,
    /// `admin.destination.resume`: a paused destination's deliveries go again.
    AdminDestinationResume,
    /// `admin.quarantine`: the entries ticks set aside, a page at a time.
    AdminQuarantine,
    /// `admin.quarantine.drop`: forget one set-aside entry.
    AdminQuarantineDrop,
    /// `admin.quarantine.requeue`: give one set-aside entry back to the tick.
    AdminQuarantineRequeue,
}

/// The door a call came through; each door reaches its own set of methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Door {
    /// `POST /v1/{method}` and WebSocket frames: clients, anonymous or with a session.
    Client,
    /// `POST /relay/v1/{method}`: other relays, authenticated by request signature.
    Relay,
    /// `POST /admin/v1/{name}` on the admin listener: the operator, by token.
    Operator,
}

impl Method {
    /// Every method, in the engine's dispatch order.
    pub const ALL: [Method; 23] = [
        Method::SessionOpen,
        Method::AccountRegister,
        Method::AccountUpdate,
        Method::DeviceRegister,
        Method::DeviceRevoke,
        Method::DeviceList,
        Method::RouteGet,
        Method::RoutePublish,
        Method::ContactRevoke,
        Method::MessageSend,
        Method::MessageDeliver,
        Method::MessageDeliverBatch,
        Method::DeliveryStatus,
        Method::TimelineSync,
        Method::AdminDeliveries,
        Method::AdminDestinations,
        Method::AdminDestinationRetry,
        Method::AdminDeliveryRetry,
        Method::AdminDestinationPause,
        Method::AdminDestinationResume,
        Method::AdminQuarantine,
        Method::AdminQuarantineDrop,
        Method::AdminQuarantineRequeue,
    ];

    /// The method's name on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            Method::SessionOpen => "session.open",
            Method::AccountRegister => "account.register",
            Method::AccountUpdate => "account.update",
            Method::DeviceRegister => "device.register",
            Method::DeviceRevoke => "device.revoke",
            Method::DeviceList => "device.list",
            Method::RouteGet => "route.get",
            Method::RoutePublish => "route.publish",
            Method::ContactRevoke => "contact.revoke",
            Method::MessageSend => "message.send",
            Method::MessageDeliver => "message.deliver",
            Method::MessageDeliverBatch => "message.deliver.batch",
            Method::DeliveryStatus => "message.delivery.status",
            Method::TimelineSync => "message.timeline.sync",
            Method::AdminDeliveries => "admin.deliveries",
            Method::AdminDestinations => "admin.destinations",
            Method::AdminDestinationRetry => "admin.destination.retry",
            Method::AdminDeliveryRetry => "admin.delivery.retry",
            Method::AdminDestinationPause => "admin.destination.pause",
            Method::AdminDestinationResume => "admin.destination.resume",
            Method::AdminQuarantine => "admin.quarantine",
            Method::AdminQuarantineDrop => "admin.quarantine.drop",
            Method::AdminQuarantineRequeue => "admin.quarantine.requeue",
        }
    }

    /// The method of a wire name, if it is one.
    pub fn parse(name: &str) -> Option<Method> {
        Method::ALL.into_iter().find(|m| m.as_str() == name)
    }

    /// Whether a call through `door` may reach this method.
    ///
    /// Relays reach only what protocol.md §4 lets a relay call; the operator reaches only
    /// `admin.*`, and nothing else reaches `admin.*`.
    pub const fn reachable_from(self, door: Door) -> bool {
        match door {
            Door::Client => !self.is_admin(),
            Door::Relay => matches!(
                self,
                Method::MessageDeliver
                    | Method::MessageDeliverBatch
                    | Method::RouteGet
                    | Method::RoutePublish
                    | Method::DeviceList
            ),
            Door::Operator => self.is_admin(),
        }
    }

    /// Whether this is an operator method (`admin.*`).
    pub const fn is_admin(self) -> bool {
        matches!(
            self,
            Method::AdminDeliveries
                | Method::AdminDestinations
                | Method::AdminDestinationRetry
                | Method::AdminDeliveryRetry
                | Method::AdminDestinationPause
                | Method::AdminDestinationResume
                | Method::AdminQuarantine
                | Method::AdminQuarantineDrop
                | Method::AdminQuarantineRequeue
        )
    }

    /// The method a name reaches through `door`, or the `not_found` error that door gives.
    pub fn through(name: &str, door: Door) -> Result<Method, crate::Error> {
        let why = match door {
            Door::Relay => "not a relay method",
            Door::Client | Door::Operator => "unknown method",
        };
        Method::parse(name)
            .filter(|m| m.reachable_from(door))
            .ok_or_else(|| crate::Error::new(crate::ErrorCode::NotFound, why))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_unique() {
        for m in Method::ALL {
            assert_eq!(Method::parse(m.as_str()), Some(m));
        }
        let names: std::collections::BTreeSet<_> = Method::ALL.iter().map(|m| m.as_str()).collect();
        assert_eq!(names.len(), Method::ALL.len());
        assert_eq!(crate::engine::METHODS.len(), Method::ALL.len());
    }

    #[test]
    fn each_door_reaches_its_own_methods() {
        let relay: Vec<_> = Method::ALL
            .into_iter()
            .filter(|m| m.reachable_from(Door::Relay))
            .map(Method::as_str)
            .collect();
        assert_eq!(
            relay,
            [
                "device.list",
                "route.get",
                "route.publish",
                "message.deliver",
                "message.deliver.batch"
            ]
        );
        assert!(Method::through("admin.deliveries", Door::Client).is_err());
        assert!(Method::through("admin.destinations", Door::Client).is_err());
        assert!(Method::through("admin.destinations", Door::Relay).is_err());
        assert_eq!(
            Method::through("admin.destinations", Door::Operator).ok(),
            Some(Method::AdminDestinations)
        );
        assert!(Method::through("message.send", Door::Operator).is_err());
        assert!(Method::through("message.send", Door::Relay).is_err());
        assert_eq!(
            Method::through("admin.deliveries", Door::Operator).ok(),
            Some(Method::AdminDeliveries)
        );
    }
}
