"""Facts from BeeGFS's own source, for checking what the scripts write against what the daemons accept.

Each daemon's config parser refuses any key it does not know and the daemon exits at start ("The config
argument '...' is invalid"). The key sets below are the keys those parsers accept, read from ThinkParQ/beegfs
at tags 7.4.7 and 8.3.1: `<daemon>/source/app/config/Config.cpp` with the common keys of
`common/source/common/app/config/AbstractConfig.cpp` and `ICommonConfig.cpp`, and for the client
`client_module/source/app/config/Config.c`. BeeGFS 8 has no C++ mgmtd or helperd; its mgmtd (Rust) takes the
TOML keys of ThinkParQ/beegfs-rust `mgmtd/assets/beegfs-mgmtd.toml`.
"""

from __future__ import annotations

CONF_KEYS: dict[tuple[str, str], frozenset[str]] = {
    ("7.4", "mgmtd"): frozenset("""
    cfgFile connAuthFile connBacklogTCP connClientPortUDP connDisableAuthentication
    connFallbackExpirationSecs connHelperdPortTCP connInterfacesFile connInterfacesList connMaxInternodeNum
    connMessagingTimeouts connMetaPortTCP connMetaPortUDP connMgmtdPortTCP connMgmtdPortUDP connMonPortUDP
    connNetFilterFile connNoDefaultRoute connPortShift connRDMABufNum connRDMABufSize connRDMATimeouts
    connRDMATypeOfService connRestrictOutboundInterfaces connStoragePortTCP connStoragePortUDP
    connTCPRcvBufSize connTcpOnlyFilterFile connUDPRcvBufSize connUseRDMA logLevel logNoDate logNumLines
    logNumRotatedFiles logStdFile logType pidFile quotaEnableEnforcement quotaQueryGIDFile
    quotaQueryGIDRange quotaQueryType quotaQueryUIDFile quotaQueryUIDRange quotaQueryWithSystemUsersGroups
    quotaStoreIntervalMin quotaUpdateIntervalMin runDaemonized storeAllowFirstRunInit storeMgmtdDirectory
    sysAllowNewServers sysAllowNewTargets sysMgmtdHost sysTargetOfflineTimeoutSecs sysUpdateTargetStatesSecs
    tuneClientAutoRemoveMins tuneMetaDynamicPools tuneMetaInodesEmergencyDynamicLimit
    tuneMetaInodesEmergencyLimit tuneMetaInodesLowDynamicLimit tuneMetaInodesLowLimit
    tuneMetaInodesLowSpreadThreshold tuneMetaInodesNormalSpreadThreshold tuneMetaNodeAutoRemoveMins
    tuneMetaSpaceEmergencyDynamicLimit tuneMetaSpaceEmergencyLimit tuneMetaSpaceLowDynamicLimit
    tuneMetaSpaceLowLimit tuneMetaSpaceLowSpreadThreshold tuneMetaSpaceNormalSpreadThreshold
    tuneNumQuotaWorkers tuneNumWorkers tuneProcessFDLimit tuneStorageDynamicPools
    tuneStorageInodesEmergencyDynamicLimit tuneStorageInodesEmergencyLimit tuneStorageInodesLowDynamicLimit
    tuneStorageInodesLowLimit tuneStorageInodesLowSpreadThreshold tuneStorageInodesNormalSpreadThreshold
    tuneStorageNodeAutoRemoveMins tuneStorageSpaceEmergencyDynamicLimit tuneStorageSpaceEmergencyLimit
    tuneStorageSpaceLowDynamicLimit tuneStorageSpaceLowLimit tuneStorageSpaceLowSpreadThreshold
    tuneStorageSpaceNormalSpreadThreshold
    """.split()),
    ("7.4", "meta"): frozenset("""
    cfgFile connAuthFile connBacklogTCP connClientPortUDP connDisableAuthentication
    connFallbackExpirationSecs connHelperdPortTCP connInterfacesFile connInterfacesList connMaxInternodeNum
    connMessagingTimeouts connMetaPortTCP connMetaPortUDP connMgmtdPortTCP connMgmtdPortUDP connMonPortUDP
    connNetFilterFile connNoDefaultRoute connPortShift connRDMABufNum connRDMABufSize connRDMATimeouts
    connRDMATypeOfService connRestrictOutboundInterfaces connStoragePortTCP connStoragePortUDP
    connTCPRcvBufSize connTcpOnlyFilterFile connUDPRcvBufSize connUseRDMA logLevel logNoDate logNumLines
    logNumRotatedFiles logStdFile logType pidFile quotaEarlyChownResponse quotaEnableEnforcement
    runDaemonized storeAllowFirstRunInit storeClientACLs storeClientXAttrs storeFsUUID storeMetaDirectory
    storeSelfHealEmptyFiles storeUseExtendedAttribs sysAllowUserSetPattern sysFileEventLogTarget
    sysMgmtdHost sysTargetAttachmentFile sysTargetOfflineTimeoutSecs sysUpdateTargetStatesSecs
    tuneBindToNumaZone tuneCommSlaveBufSize tuneDefaultChunkSize tuneDefaultNumStripeNodes
    tuneDefaultNumStripeTargets tuneDirMetadataCacheLimit tuneDisposalGCPeriod tuneEarlyUnlinkResponse
    tuneListenerNumaAffinity tuneListenerPrioShift tuneLockGrantNumRetries tuneLockGrantWaitMS
    tuneMirrorTimestamps tuneNumCommSlaves tuneNumResyncSlaves tuneNumStreamListeners tuneNumWorkers
    tuneProcessFDLimit tuneRotateMirrorTargets tuneTargetChooser tuneUseAggressiveStreamPoll
    tuneUsePerUserMsgQueues tuneWorkerBufSize tuneWorkerNumaAffinity
    """.split()),
    ("7.4", "storage"): frozenset("""
    cfgFile connAuthFile connBacklogTCP connClientPortUDP connDisableAuthentication
    connFallbackExpirationSecs connHelperdPortTCP connInterfacesFile connInterfacesList connMaxInternodeNum
    connMessagingTimeouts connMetaPortTCP connMetaPortUDP connMgmtdPortTCP connMgmtdPortUDP connMonPortUDP
    connNetFilterFile connNoDefaultRoute connPortShift connRDMABufNum connRDMABufSize connRDMATimeouts
    connRDMATypeOfService connRestrictOutboundInterfaces connStoragePortTCP connStoragePortUDP
    connTCPRcvBufSize connTcpOnlyFilterFile connUDPRcvBufSize connUseRDMA logLevel logNoDate logNumLines
    logNumRotatedFiles logStdFile logType pidFile quotaDisableZfsSupport quotaEnableEnforcement
    runDaemonized storeAllowFirstRunInit storeFsUUID storeStorageDirectory sysMgmtdHost
    sysResyncSafetyThresholdMins sysTargetOfflineTimeoutSecs sysUpdateTargetStatesSecs tuneBindToNumaZone
    tuneDirCacheLimit tuneEarlyStat tuneFileReadAheadSize tuneFileReadAheadTriggerSize tuneFileReadSize
    tuneFileWriteSize tuneFileWriteSyncSize tuneListenerNumaAffinity tuneListenerPrioShift
    tuneNumResyncGatherSlaves tuneNumResyncSlaves tuneNumStreamListeners tuneNumWorkers tuneProcessFDLimit
    tuneUseAggressiveStreamPoll tuneUsePerTargetWorkers tuneUsePerUserMsgQueues tuneWorkerBufSize
    tuneWorkerNumaAffinity
    """.split()),
    ("7.4", "helperd"): frozenset("""
    cfgFile connAuthFile connBacklogTCP connClientPortUDP connDisableAuthentication
    connFallbackExpirationSecs connHelperdPortTCP connInterfacesFile connMaxInternodeNum
    connMessagingTimeouts connMetaPortTCP connMetaPortUDP connMgmtdPortTCP connMgmtdPortUDP connMonPortUDP
    connNetFilterFile connNoDefaultRoute connPortShift connRDMABufNum connRDMABufSize connRDMATimeouts
    connRDMATypeOfService connRestrictOutboundInterfaces connStoragePortTCP connStoragePortUDP
    connTCPRcvBufSize connTcpOnlyFilterFile connUDPRcvBufSize connUseRDMA logLevel logNoDate logNumLines
    logNumRotatedFiles logStdFile logType pidFile runDaemonized sysMgmtdHost sysUpdateTargetStatesSecs
    tuneNumWorkers
    """.split()),
    ("7.4", "client"): frozenset("""
    cfgFile connAuthFile connClientPortUDP connCommRetrySecs connDisableAuthentication
    connFallbackExpirationSecs connHelperdPortTCP connInterfacesFile connInterfacesList
    connMaxConcurrentAttempts connMaxInternodeNum connMessagingTimeouts connMgmtdPortTCP connMgmtdPortUDP
    connNetFilterFile connPortShift connRDMABufNum connRDMABufSize connRDMAFragmentSize
    connRDMAInterfacesFile connRDMAKeyType connRDMAMetaBufNum connRDMAMetaBufSize connRDMAMetaFragmentSize
    connRDMATimeouts connRDMATypeOfService connTCPFallbackEnabled connTCPRcvBufSize connTcpOnlyFilterFile
    connUDPRcvBufSize connUnmountRetries connUseRDMA logClientID logHelperdIP logLevel logStdFile logType
    quotaEnabled remapConnectionFailureStatus sysACLsEnabled sysACLsRevalidate sysCreateHardlinksAsSymlinks
    sysFileEventLogMask sysInodeIDStyle sysMgmtdHost sysMountSanityCheckMS sysNoEnterpriseFeatureMsg
    sysRenameEbusyAsXdev sysSessionCheckOnClose sysSessionChecksEnabled sysSyncOnClose
    sysTargetOfflineTimeoutSecs sysUpdateTargetStatesSecs sysXAttrsCheckCapabilities sysXAttrsEnabled
    tuneCoherentBuffers tuneDirSubentryCacheValidityMS tuneENOENTCacheValidityMS tuneEarlyCloseResponse
    tuneFileCacheBufNum tuneFileCacheBufSize tuneFileCacheType tuneFileSubentryCacheValidityMS
    tuneInodeBlockBits tuneMsgBufNum tuneMsgBufSize tunePageCacheValidityMS tunePathBufNum tunePathBufSize
    tunePreferredMetaFile tunePreferredStorageFile tuneRefreshOnGetAttr tuneRemoteFSync tuneStatFsCacheSecs
    tuneUseBufferedAppend tuneUseGlobalAppendLocks tuneUseGlobalFileLocks
    """.split()),
    ("8", "meta"): frozenset("""
    cfgFile connAuthFile connBacklogTCP connClientPort connDisableAuthentication connDisableIPv6
    connFallbackExpirationSecs connInterfacesFile connInterfacesList connMaxInternodeNum
    connMessagingTimeouts connMetaPort connMgmtdPort connMonPort connNetFilterFile connNoDefaultRoute
    connPortShift connRDMABufNum connRDMABufSize connRDMATimeouts connRDMATypeOfService
    connRestrictOutboundInterfaces connStoragePort connTCPRcvBufSize connTcpOnlyFilterFile connUDPRcvBufSize
    connUseRDMA logLevel logNoDate logNumLines logNumRotatedFiles logStdFile logType pidFile
    quotaEarlyChownResponse quotaEnableEnforcement runDaemonized storeAllowFirstRunInit storeClientACLs
    storeClientXAttrs storeFsUUID storeMetaDirectory storeSelfHealEmptyFiles storeUseExtendedAttribs
    sysAllowUserSetPattern sysFileEventLogTarget sysFileEventPersistDirectory sysFileEventPersistSize
    sysMgmtdHost sysTargetAttachmentFile sysTargetOfflineTimeoutSecs sysUpdateTargetStatesSecs
    tuneBindToNumaZone tuneChunkBalanceLockingTimeLimit tuneChunkBalanceQueueLimit tuneCommSlaveBufSize
    tuneDefaultChunkSize tuneDefaultNumStripeNodes tuneDefaultNumStripeTargets tuneDirMetadataCacheLimit
    tuneDisposalGCPeriod tuneEarlyUnlinkResponse tuneListenerNumaAffinity tuneListenerPrioShift
    tuneLockGrantNumRetries tuneLockGrantWaitMS tuneMirrorTimestamps tuneNumCommSlaves tuneNumResyncSlaves
    tuneNumStreamListeners tuneNumWorkers tuneProcessFDLimit tuneRotateMirrorTargets tuneTargetChooser
    tuneUseAggressiveStreamPoll tuneUsePerUserMsgQueues tuneWorkerBufSize tuneWorkerNumaAffinity
    """.split()),
    ("8", "storage"): frozenset("""
    cfgFile connAuthFile connBacklogTCP connClientPort connDisableAuthentication connDisableIPv6
    connFallbackExpirationSecs connInterfacesFile connInterfacesList connMaxInternodeNum
    connMessagingTimeouts connMetaPort connMgmtdPort connMonPort connNetFilterFile connNoDefaultRoute
    connPortShift connRDMABufNum connRDMABufSize connRDMATimeouts connRDMATypeOfService
    connRestrictOutboundInterfaces connStoragePort connTCPRcvBufSize connTcpOnlyFilterFile connUDPRcvBufSize
    connUseRDMA logLevel logNoDate logNumLines logNumRotatedFiles logStdFile logType pidFile
    quotaDisableZfsSupport quotaEnableEnforcement runDaemonized storeAllowFirstRunInit storeFsUUID
    storeStorageDirectory sysMgmtdHost sysResyncSafetyThresholdMins sysTargetOfflineTimeoutSecs
    sysUpdateTargetStatesSecs tuneBindToNumaZone tuneChunkBalanceQueueLimit tuneDirCacheLimit tuneEarlyStat
    tuneFileReadAheadSize tuneFileReadAheadTriggerSize tuneFileReadSize tuneFileWriteSize
    tuneFileWriteSyncSize tuneListenerNumaAffinity tuneListenerPrioShift tuneNumResyncGatherSlaves
    tuneNumResyncSlaves tuneNumStreamListeners tuneNumWorkers tuneProcessFDLimit tuneUseAggressiveStreamPoll
    tuneUsePerTargetWorkers tuneUsePerUserMsgQueues tuneWorkerBufSize tuneWorkerNumaAffinity
    """.split()),
    ("8", "client"): frozenset("""
    cfgFile connAuthFile connClientPort connClientPortUDP connCommRetrySecs connDisableAuthentication
    connDisableIPv6 connFallbackExpirationSecs connHelperdPortTCP connInterfacesFile connInterfacesList
    connMaxConcurrentAttempts connMaxInternodeNum connMessagingTimeouts connMgmtdPort connMgmtdPortTCP
    connMgmtdPortUDP connNetFilterFile connPortShift connRDMABufNum connRDMABufSize connRDMAFragmentSize
    connRDMAInterfacesFile connRDMAKeyType connRDMAMetaBufNum connRDMAMetaBufSize connRDMAMetaFragmentSize
    connRDMATimeouts connRDMATypeOfService connTCPFallbackEnabled connTCPRcvBufSize connTcpOnlyFilterFile
    connUDPRcvBufSize connUnmountRetries connUseRDMA logClientID logHelperdIP logLevel logStdFile logType
    quotaEnabled remapConnectionFailureStatus sysACLsEnabled sysACLsRevalidate
    sysBypassFileAccessCheckOnMeta sysCacheInvalidationVersion sysCreateHardlinksAsSymlinks
    sysFileEventLogMask sysInodeIDStyle sysMgmtdHost sysMountSanityCheckMS sysRenameEbusyAsXdev
    sysSELinuxEnabled sysSELinuxRevalidate sysSessionCheckOnClose sysSessionChecksEnabled sysSyncOnClose
    sysTargetOfflineTimeoutSecs sysUpdateTargetStatesSecs sysXAttrsCheckCapabilities sysXAttrsEnabled
    tuneCoherentBuffers tuneDirSubentryCacheValidityMS tuneENOENTCacheValidityMS tuneEarlyCloseResponse
    tuneFileCacheBufNum tuneFileCacheBufSize tuneFileCacheType tuneFileOpenRetryIntervalMS
    tuneFileOpenRetryTimeoutMS tuneFileSubentryCacheValidityMS tuneInodeBlockBits tuneMsgBufNum
    tuneMsgBufSize tunePageCacheValidityMS tunePathBufNum tunePathBufSize tunePreferredMetaFile
    tunePreferredStorageFile tuneRefreshOnGetAttr tuneRemoteFSync tuneStatFsCacheSecs tuneUseBufferedAppend
    tuneUseGlobalAppendLocks tuneUseGlobalFileLocks
    """.split()),
}

MGMTD8_TOML_KEYS = frozenset("""
    db-file log-target log-level beemsg-port grpc-port tls-disable tls-cert-file tls-key-file interfaces
    ipv6-disable connection-limit auth-disable auth-file registration-disable node-offline-timeout
    client-auto-remove-timeout license-cert-file license-lib-file max-blocking-threads quota-enable
    quota-enforce quota-update-interval quota-user-system-ids-min quota-user-ids-file quota-user-ids-range
    quota-group-system-ids-min quota-group-ids-file quota-group-ids-range
""".split())
